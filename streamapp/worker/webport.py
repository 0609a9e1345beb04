"""What a worker's web port answers (R21): the documented routes, behind an optional token.

Faust's own routes (``/table/...`` shows the join's state, ``/router/...``, its statistics and
graph) are turned off by its settings (streamapp.worker.factory). The one Faust serves whatever
they say, its index at ``/``, answers 404 here, as does any path no route serves.

With ``STREAMAPP_WEB_TOKEN`` set, every route but the health checks needs it, compared in
constant time: as ``Authorization: Bearer <token>``, or the cookie a browser gets by opening any
page once with ``?token=<token>`` (it is sent to the same page without the token, so the address
bar and history do not keep it). The worker writes no access log, and no message names the token.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

# Answered without the token: an orchestrator's probes carry none.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
_FAUST_INDEX = "/"
COOKIE = "streamapp_token"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard(token: str) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The aiohttp middleware that answers only the worker's own routes, with ``token`` if set."""
    expected = token.encode()

    def presented(request: web.Request) -> bytes:
        scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return credentials.strip().encode()
        return request.cookies.get(COOKIE, "").encode()

    @web.middleware
    async def answer(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == _FAUST_INDEX:
            raise web.HTTPNotFound()
        if expected and request.path not in OPEN_PATHS:
            query_token = request.query.get("token")
            if query_token is not None:
                if not hmac.compare_digest(query_token.encode(), expected):
                    raise _unauthorized()
                found = web.HTTPSeeOther(request.rel_url.with_query(
                    [(name, value) for name, value in request.query.items() if name != "token"]))
                found.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
                raise found
            if not hmac.compare_digest(presented(request), expected):
                raise _unauthorized()
        return await handler(request)

    return answer


def _unauthorized() -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Bearer realm="streamapp"'},
                                text="this worker's web port needs its token (STREAMAPP_WEB_TOKEN): send "
                                     "'Authorization: Bearer <token>', or open the page once with ?token=<token>\n")
