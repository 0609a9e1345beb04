"""A worker's web port answers only the documented routes, and with a token set only to those who
send it (R21). The guard runs in a real aiohttp server here; tests/integration/test_preview_browser.py
checks a real worker (its listening socket, Faust's routes, the preview page in a browser)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from faust.types.settings import Settings as FaustSettings
from faust.web.base import DEBUG_BLUEPRINTS, DEFAULT_BLUEPRINTS

from streamapp.settings import Settings, SettingsError
from streamapp.worker.factory import create_app, faust_variables
from streamapp.worker.webport import COOKIE, ROUTES, guard, private_routes_note

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
TOKEN = "s3cret-Token_1"


def documented_routes() -> set[str]:
    section = DOC.split("## What a worker serves", 1)[1].split("\n## ", 1)[0]
    return {re.sub(r"<(\w+)>", r"{\1}", path) for path in re.findall(r"^\| `(/[^`]*)` \|", section, re.M)}


# Faust's own variables, which would turn its routes back on and move the port off loopback.
FAUST_OVERRIDES = {"WEB_BIND": "0.0.0.0", "APP_WEB_TABLES_ENABLED": "true", "APP_WEB_ROUTER_ENABLED": "true",
                   "APP_WEB_GRAPH_ENABLED": "true", "APP_WEB_STATS_ENABLED": "true", "BROKER_CHECK_CRCS": "false",
                   "BROKER_URL": "kafka://elsewhere:9092", "PROCESSING_GUARANTEE": "exactly_once"}


def _app(tmp_path):
    # 256 MiB: a RocksDB pool of 64 MiB, the size the store tests give the process-wide pool; frames
    # of up to 1 MiB, for which four stages' buffers fit in it.
    return create_app(Settings(data_dir=tmp_path / "data", out_dir=tmp_path / "out",
                               memory_budget_bytes=256 * 1024**2, max_frame_bytes=1024**2))


def test_a_worker_serves_exactly_the_documented_routes_whatever_faust_s_variables_say(tmp_path, monkeypatch):
    for name, value in FAUST_OVERRIDES.items():
        monkeypatch.setenv(name, value)
    app = _app(tmp_path)
    app.web.init_server()  # Faust's blueprints and our pages, as the worker mounts them
    served = {route.resource.canonical for route in app.web.web_app.router.routes() if route.resource}
    # Faust's index has no setting to turn it off; the guard answers it 404 (below).
    assert served - {"/"} == documented_routes() == ROUTES
    assert (app.conf.web_bind, app.conf.broker_check_crcs, str(app.conf.broker[0])) == \
        ("127.0.0.1", True, "kafka://127.0.0.1:9092")
    assert app.conf.processing_guarantee.value == "at_least_once"


def test_faust_reads_none_of_its_own_variables(tmp_path, monkeypatch):
    clean = _app(tmp_path).conf
    variables = {param.env_name: name for name, param in FaustSettings.SETTINGS.items() if param.env_name}
    assert {"WEB_BIND", "WEB_PORT", "BROKER_URL", "BROKER_CREDENTIALS", "APP_WEB_TABLES_ENABLED"} <= set(variables)
    for variable in set(variables) - {"APP_ENV_PREFIX"}:  # a prefix would have Faust read other names
        # Kubernetes sets WEB_PORT so for a Service named "web"; any value would do.
        monkeypatch.setenv(variable, "tcp://10.0.0.1:80")
    conf = _app(tmp_path).conf
    assert {name: getattr(conf, name) for name in variables.values()} == \
        {name: getattr(clean, name) for name in variables.values()}
    assert faust_variables(os.environ) == sorted(set(variables) - {"APP_ENV_PREFIX"})


def test_faust_s_own_routes_answer_404_even_when_mounted(tmp_path):
    app = _app(tmp_path)
    for prefix, blueprint in (*DEFAULT_BLUEPRINTS, *DEBUG_BLUEPRINTS):
        app.web.blueprints.add(prefix, blueprint)
    app.web.init_server()
    mounted = {route.resource.canonical for route in app.web.web_app.router.routes() if route.resource}
    faust = ["/", "/table/", "/table/join/", "/table/join/k/", "/router/", "/graph/", "/stats/"]
    assert {"/table/", "/table/{name}/", "/table/{name}/{key}/", "/router/", "/graph/"} <= mounted

    async def statuses() -> list[int]:
        async with TestClient(TestServer(app.web.web_app)) as client:
            return [(await client.get(path)).status for path in ["/healthz", *faust]]

    assert asyncio.run(statuses()) == [200] + [404] * len(faust)


def _bound(address: str):
    return lambda: address


async def _answers(token: str, requests: list[tuple[str, dict]], bind: str = "127.0.0.1") -> list[tuple[int, dict]]:
    async def ok(request):
        return web.Response(text="ok")

    application = web.Application(middlewares=[guard(token, _bound(bind))])
    for path in (*ROUTES, "/", "/table/{name}/"):
        application.router.add_get(path, ok)
    async with TestClient(TestServer(application)) as client:
        answers = []
        for path, headers in requests:
            response = await client.get(path, headers=headers, allow_redirects=False)
            answers.append((response.status, dict(response.headers)))
        return answers


def _statuses(token: str, *requests, bind: str = "127.0.0.1") -> list[int]:
    return [status for status, _ in asyncio.run(_answers(token, [(path, headers) for path, headers in requests],
                                                         bind))]


def test_without_a_token_on_loopback_every_documented_route_answers_and_nothing_else():
    assert _statuses("", ("/metrics", {}), ("/preview/frame/cam1", {}), ("/streamapp/stats/", {}), ("/", {}),
                     ("/table/join/", {}), ("/tables/", {})) == [200, 200, 200, 404, 404, 404]


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "10.1.2.3", "worker-0.example"])
def test_beyond_loopback_without_a_token_frames_and_stats_are_not_served(bind):
    paths = ("/preview/", "/preview/streams.json", "/preview/frame/cam1", "/streamapp/stats/")
    private = [(path, {}) for path in paths]
    assert _statuses("", *private, bind=bind) == [404] * 4
    assert _statuses("", ("/metrics", {}), ("/healthz", {}), ("/readyz", {}), bind=bind) == [200] * 3
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert _statuses(TOKEN, *[(path, bearer) for path, _ in private], bind=bind) == [200] * 4
    assert "STREAMAPP_WEB_TOKEN" in private_routes_note(bind) and "/preview/" in private_routes_note(bind)


def test_on_loopback_a_request_naming_another_host_is_refused():
    hosts = ["127.0.0.1:6066", "localhost:6066", "LOCALHOST", "[::1]:6066", "127.0.0.2"]
    assert _statuses("", *[("/preview/", {"Host": host}) for host in hosts]) == [200] * len(hosts)
    rebound = ["evil.example:6066", "127.0.0.1.evil.example", "10.1.2.3:6066", "[::1", "localhost.:x"]
    assert _statuses("", *[("/preview/", {"Host": host}) for host in rebound]) == [421] * len(rebound)
    assert _statuses("", ("/preview/", {"Host": "evil.example"}), bind="0.0.0.0") == [404]
    assert _statuses(TOKEN, ("/preview/", {"Host": "evil.example", "Authorization": f"Bearer {TOKEN}"}),
                     bind="0.0.0.0") == [200]


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


def test_a_browser_opening_a_page_with_the_token_gets_a_cookie_that_is_not_the_token():
    (status, headers), = asyncio.run(_answers(TOKEN, [("/preview/?token=" + TOKEN, {})]))
    assert status == 303 and headers["Location"] == "/preview/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    value = cookie.split(";")[0].removeprefix(f"{COOKIE}=")
    assert _statuses(TOKEN, ("/preview/frame/cam1", {"Cookie": f"{COOKIE}={value}"}),
                     ("/preview/frame/cam1", {"Cookie": f"{COOKIE}={TOKEN}"}),
                     ("/preview/frame/cam1", {"Authorization": f"Bearer {value}"})) == [200, 401, 401]


def test_the_token_comes_from_its_file_and_never_shows(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    settings = Settings.from_env({"STREAMAPP_WEB_TOKEN_FILE": str(token_file)})
    assert settings.web_token == TOKEN and TOKEN not in repr(settings)
    with pytest.raises(SettingsError, match="both set") as both:
        Settings.from_env({"STREAMAPP_WEB_TOKEN_FILE": str(token_file), "STREAMAPP_WEB_TOKEN": TOKEN})
    # Read from the file, then refused: the line names the variable, never the value.
    token_file.write_text(f"{TOKEN} {TOKEN}\n")
    with pytest.raises(SettingsError, match="STREAMAPP_WEB_TOKEN must be printable ASCII without spaces") as spaced:
        Settings.from_env({"STREAMAPP_WEB_TOKEN_FILE": str(token_file)})
    assert TOKEN not in str(both.value) and TOKEN not in str(spaced.value)
    token_file.write_text("\n")
    with pytest.raises(SettingsError, match="is empty"):
        Settings.from_env({"STREAMAPP_WEB_TOKEN_FILE": str(token_file)})
    with pytest.raises(SettingsError, match="cannot be read"):
        Settings.from_env({"STREAMAPP_WEB_TOKEN_FILE": str(tmp_path / "none")})


def test_a_worker_says_at_start_what_it_ignores_and_does_not_serve(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WEB_BIND", "0.0.0.0")
    monkeypatch.setenv("BROKER_URL", "kafka://elsewhere:9092")
    app = create_app(Settings(data_dir=tmp_path / "data", out_dir=tmp_path / "out", memory_budget_bytes=256 * 1024**2,
                              max_frame_bytes=1024**2, web_bind="0.0.0.0"))
    with caplog.at_level(logging.WARNING, logger="streamapp.worker.factory"):
        app._log_what_is_not_used()
    ignored, not_served = [record.getMessage() for record in caplog.records]
    assert ignored.startswith("ignoring BROKER_URL, WEB_BIND: Faust's own settings")
    assert not_served.startswith("the web port listens on 0.0.0.0 without a token, so it does not serve /preview/")
    assert "STREAMAPP_WEB_TOKEN or STREAMAPP_WEB_TOKEN_FILE" in not_served


def test_a_stream_without_a_frame_is_a_404_no_browser_takes_for_anything_but_text(tmp_path):
    app = _app(tmp_path)
    app.web.init_server()

    async def answer():
        async with TestClient(TestServer(app.web.web_app)) as client:
            response = await client.get("/preview/frame/%3Cscript%3E")
            return response.status, response.headers

    status, headers = asyncio.run(answer())
    assert status == 404 and headers["Content-Type"].startswith("text/plain")
    assert headers["X-Content-Type-Options"] == "nosniff"
