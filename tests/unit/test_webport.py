"""A worker's web port answers only the documented routes, and with a token set only to those who
send it (R21). The guard runs in a real aiohttp server here; tests/integration/test_preview_browser.py
checks a real worker (its listening socket, Faust's routes, the preview page in a browser)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from streamapp.settings import Settings, SettingsError
from streamapp.worker.factory import create_app
from streamapp.worker.webport import COOKIE, OPEN_PATHS, guard

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
TOKEN = "s3cret-Token_1"


def documented_routes() -> set[str]:
    section = DOC.split("## What a worker serves", 1)[1].split("\n## ", 1)[0]
    return {re.sub(r"<(\w+)>", r"{\1}", path) for path in re.findall(r"^\| `(/[^`]*)` \|", section, re.M)}


def test_a_worker_serves_exactly_the_documented_routes_and_faust_s_index_is_refused(tmp_path):
    # 256 MiB: a RocksDB pool of 64 MiB, the size the store tests give the process-wide pool; frames
    # of up to 1 MiB, for which four stages' buffers fit in it.
    app = create_app(Settings(data_dir=tmp_path / "data", out_dir=tmp_path / "out", memory_budget_bytes=256 * 1024**2,
                              max_frame_bytes=1024**2))
    app.web.init_server()  # Faust's blueprints and our pages, as the worker mounts them
    served = {route.resource.canonical for route in app.web.web_app.router.routes() if route.resource}
    # Faust's index has no setting to turn it off; the guard answers it 404 (below). The health
    # checks are served where they are implemented.
    assert served - {"/"} - OPEN_PATHS == documented_routes() - OPEN_PATHS
    assert not any(path.startswith(("/table", "/router", "/graph", "/stats", "/performance")) for path in served)
    assert app.conf.web_bind == "127.0.0.1"


async def _answers(token: str, requests: list[tuple[str, dict]]) -> list[tuple[int, dict]]:
    async def ok(request):
        return web.Response(text="ok")

    application = web.Application(middlewares=[guard(token)])
    for path in ("/", "/metrics", "/healthz", "/readyz", "/preview/", "/preview/frame/{stream}"):
        application.router.add_get(path, ok)
    async with TestClient(TestServer(application)) as client:
        answers = []
        for path, headers in requests:
            response = await client.get(path, headers=headers, allow_redirects=False)
            answers.append((response.status, dict(response.headers)))
        return answers


def _statuses(token: str, *requests) -> list[int]:
    return [status for status, _ in asyncio.run(_answers(token, [(path, headers) for path, headers in requests]))]


def test_without_a_token_every_route_answers_but_faust_s_index():
    assert _statuses("", ("/metrics", {}), ("/preview/frame/cam1", {}), ("/", {}), ("/table/join/", {})) == \
        [200, 200, 404, 404]


def test_with_a_token_every_route_but_the_health_checks_needs_it():
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert _statuses(TOKEN, ("/metrics", {}), ("/preview/", {}), ("/preview/frame/cam1", {}),
                     ("/healthz", {}), ("/readyz", {})) == [401, 401, 401, 200, 200]
    assert _statuses(TOKEN, ("/metrics", bearer), ("/preview/frame/cam1", {"Authorization": f"bearer {TOKEN}"})) \
        == [200, 200]
    assert _statuses(TOKEN, ("/metrics", {"Authorization": f"Bearer {TOKEN}x"}),
                     ("/metrics", {"Authorization": f"Basic {TOKEN}"}), ("/metrics", {"Authorization": "Bearer "}),
                     ("/metrics", {"Cookie": f"{COOKIE}=wrong"}), ("/metrics?token=wrong", {})) == [401] * 5
    (status, headers), = asyncio.run(_answers(TOKEN, [("/metrics", {})]))
    assert headers["WWW-Authenticate"].startswith("Bearer")


def test_a_browser_opening_a_page_with_the_token_gets_a_cookie_and_the_page_without_the_token():
    (status, headers), (with_cookie, _) = asyncio.run(_answers(TOKEN, [
        ("/preview/?token=" + TOKEN, {}),
        ("/preview/frame/cam1", {"Cookie": f"{COOKIE}={TOKEN}"}),
    ]))
    assert status == 303 and headers["Location"] == "/preview/"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}={TOKEN};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert with_cookie == 200


def test_the_token_comes_from_its_file_and_never_shows(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    settings = Settings.from_env({"STREAMAPP_WEB_TOKEN_FILE": str(token_file)})
    assert settings.web_token == TOKEN and TOKEN not in repr(settings)
    with pytest.raises(SettingsError, match="both set"):
        Settings.from_env({"STREAMAPP_WEB_TOKEN_FILE": str(token_file), "STREAMAPP_WEB_TOKEN": TOKEN})
    token_file.write_text("\n")
    with pytest.raises(SettingsError, match="is empty"):
        Settings.from_env({"STREAMAPP_WEB_TOKEN_FILE": str(token_file)})
    with pytest.raises(SettingsError, match="cannot be read") as missing:
        Settings.from_env({"STREAMAPP_WEB_TOKEN_FILE": str(tmp_path / "none")})
    with pytest.raises(SettingsError, match="printable ASCII without spaces") as spaced:
        Settings(web_token="two words")
    assert "two words" not in str(spaced.value) and TOKEN not in str(missing.value)
