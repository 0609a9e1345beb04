"""What a worker's web port answers (R21): the documented routes, behind an optional token.

The guard answers only :data:`ROUTES` (docs/operations.md, "What a worker serves"); any other
path answers 404, whatever Faust mounts (its index at ``/``, and its ``/table/...`` pages, which
would show the join's waiting frames, should anything turn them on).

With ``STREAMAPP_WEB_TOKEN`` set, every route but the health checks needs it, compared in
constant time: as ``Authorization: Bearer <token>``, or the cookie a browser gets by opening any
page once with ``?token=<token>`` (it is sent to the same page without the token, so the address
bar and history do not keep it). The cookie holds a value derived from the token, not the token,
as a browser sends it to every port of the host. Without a token, a port that listens beyond
loopback does not serve :data:`PRIVATE_ROUTES` (camera frames). On loopback, a request naming
another host (a DNS name rebound to 127.0.0.1 by a web page) is refused. The worker writes no
access log, and no message names the token.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable

import yarl
from aiohttp import web

from streamapp.settings import is_loopback

# Answered without the token: an orchestrator's probes carry none.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# Served only with a token or on loopback: the sink's camera frames and the stage's own numbers.
PRIVATE_ROUTES = frozenset({"/streamapp/stats/", "/preview/", "/preview/streams.json", "/preview/frame/{stream}"})
# Every route a worker answers, as aiohttp names them.
ROUTES = OPEN_PATHS | PRIVATE_ROUTES | {"/metrics"}
COOKIE = "streamapp_token"
TOKEN_SETTINGS = "STREAMAPP_WEB_TOKEN or STREAMAPP_WEB_TOKEN_FILE"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def private_routes_off(bind: str, token: str) -> bool:
    return not token and not is_loopback(bind)


def private_routes_note(bind: str) -> str:
    """The line a worker logs at start when :func:`private_routes_off`."""
    return (f"the web port listens on {bind} without a token, so it does not serve "
            f"{', '.join(sorted(PRIVATE_ROUTES))} there; set {TOKEN_SETTINGS} to serve them")


def cookie_value(token: str) -> str:
    """What the cookie holds: derived from the token, so a cookie sent elsewhere does not give it away."""
    return hmac.new(token.encode(), b"streamapp web cookie", hashlib.sha256).hexdigest()


def guard(token: str, bind: Callable[[], str]) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The aiohttp middleware that answers only the worker's own routes, with ``token`` if set.
    ``bind`` is the address the port listens on (read at each request: Faust's ``--web-bind``
    sets it after the app is made)."""
    expected, expected_cookie = token.encode(), cookie_value(token).encode()

    def authorized(request: web.Request) -> bool:
        scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return hmac.compare_digest(credentials.strip().encode(), expected)
        return hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), expected_cookie)

    @web.middleware
    async def answer(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else None
        listening = bind()
        if route not in ROUTES or (route in PRIVATE_ROUTES and private_routes_off(listening, token)):
            raise web.HTTPNotFound()
        if is_loopback(listening) and not _names_this_host(request.headers.get("Host")):
            raise web.HTTPMisdirectedRequest(text="this worker's web port listens on loopback: address it as "
                                                  "127.0.0.1, [::1] or localhost\n")
        if expected and route not in OPEN_PATHS:
            query_token = request.query.get("token")
            if query_token is not None:
                if not hmac.compare_digest(query_token.encode(), expected):
                    raise _unauthorized()
                found = web.HTTPSeeOther(request.rel_url.with_query(
                    [(name, value) for name, value in request.query.items() if name != "token"]))
                found.set_cookie(COOKIE, cookie_value(token), httponly=True, samesite="Strict", path="/")
                raise found
            if not authorized(request):
                raise _unauthorized()
        return await handler(request)

    return answer


def _names_this_host(host_header: str | None) -> bool:
    """The Host a request names is a loopback address or ``localhost`` (or absent: no browser
    sends a request without it)."""
    if host_header is None:
        return True
    try:
        host = yarl.URL(f"http://{host_header}").host
    except ValueError:
        return False
    return host is not None and is_loopback(host)


def _unauthorized() -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Bearer realm="streamapp"'},
                                text="this worker's web port needs its token (STREAMAPP_WEB_TOKEN): send "
                                     "'Authorization: Bearer <token>', or open the page once with ?token=<token>\n")
