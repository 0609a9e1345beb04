"""Java and the Kafka jars: the Java found and checked, the jars copied from Maven Central once."""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from streamapp.filelock import file_lock
from streamapp.tools.localkafka.common import KAFKA_VERSION, MIN_JAVA, BrokerError, JavaNotFound, MavenNotFound, Notify
from streamapp.tools.localkafka.locations import kafka_home

log = logging.getLogger(__name__)




def parse_java_version(text: str) -> int:
    """The major version in ``java -version`` output: ``"17.0.15" -> 17``, ``"1.8.0_292" -> 8``."""
    match = re.search(r'version "([^"]+)"', text)
    if not match:
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise BrokerError(f"cannot read the Java version from `java -version`, which printed {first!r}")
    parts = re.split(r"[._+-]", match.group(1))
    try:
        major = int(parts[0])
        if major == 1 and len(parts) > 1:
            major = int(parts[1])
    except ValueError:
        raise BrokerError(f"cannot read the Java version {match.group(1)!r} printed by `java -version`") from None
    return major


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` when it exists, else ``java`` on the PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK):
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise JavaNotFound(
            f"Java not found: the Kafka {KAFKA_VERSION} broker needs Java {MIN_JAVA}+",
            f"install a JDK {MIN_JAVA} or newer and put `java` on the PATH, or set JAVA_HOME"
        )
    return found


def check_java(java: str | None = None) -> str:
    """Return the ``java`` to run, after making sure it is Java 17 or newer."""
    java = java or find_java()
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise BrokerError(f"cannot run {java}: {exc}") from None
    major = parse_java_version(proc.stderr + proc.stdout)
    if major < MIN_JAVA:
        raise JavaNotFound(
            f"{java} is Java {major}; the Kafka {KAFKA_VERSION} broker needs Java {MIN_JAVA}+",
            f"install a JDK {MIN_JAVA} or newer, or point JAVA_HOME at one"
        )
    return java


def packaged(name: str) -> bytes:
    return (resources.files("streamapp.tools.localkafka.kafka") / name).read_bytes()


def ensure_jars(home: Path | str | None = None, *, notify: Notify | None = None) -> Path:
    """Return the directory of Kafka jars, fetching them with Maven on first use."""
    home = Path(home) if home is not None else kafka_home()
    return copy_maven_dependencies(
        packaged("pom.xml"), home, what=f"the Apache Kafka {KAFKA_VERSION} jars",
        expected_jar=f"kafka_2.13-{KAFKA_VERSION}.jar",
        cache_hint="set STREAMAPP_KAFKA_HOME to a directory whose libs/ already holds them",
        notify=notify)


def copy_maven_dependencies(pom: bytes, home: Path, *, what: str, expected_jar: str, cache_hint: str,
                            notify: Notify | None = None) -> Path:
    """Return ``home/libs`` holding the runtime dependencies of ``pom``, copied by Maven once.

    The copy is made in a scratch directory and moved into place with a marker file holding the
    pom's hash, so an interrupted copy is never used and a changed pom fetches again. A file
    lock keeps concurrent first runs from fetching twice.
    """
    notify = notify or log.info
    libs = home / "libs"
    digest = hashlib.sha256(pom).hexdigest()[:16]
    if _jars_complete(libs, digest):
        return libs
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BrokerError(f"cannot create the jar cache {home}: {exc} ({cache_hint})") from None
    with file_lock(home / ".lock"):
        if _jars_complete(libs, digest):
            return libs
        mvn = shutil.which("mvn")
        if not mvn:
            raise MavenNotFound(
                f"{what} are not in {libs} and Maven (`mvn`) is not installed to fetch them from "
                f"Maven Central", f"install Maven (needed once), or {cache_hint}"
            )
        notify(f"fetching {what} from Maven Central into {libs} (first run only)")
        work = Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
        try:
            (work / "pom.xml").write_bytes(pom)
            fetched = work / "libs"
            proc = subprocess.run(
                [mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
                 f"-DoutputDirectory={fetched}", "-DincludeScope=runtime"],
                capture_output=True, text=True, cwd=work,
            )
            if proc.returncode != 0 or not list(fetched.glob(expected_jar)):
                log_file = home / "maven.log"
                log_file.write_text(proc.stdout + proc.stderr)
                raise BrokerError(
                    f"Maven could not fetch {what} (exit code {proc.returncode})",
                    f"check the network access to Maven Central; Maven's output is in {log_file}"
                )
            (fetched / ".complete").write_text(digest + "\n")
            if libs.exists():
                shutil.rmtree(libs)
            os.replace(fetched, libs)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return libs


def _jars_complete(libs: Path, digest: str) -> bool:
    try:
        return (libs / ".complete").read_text().strip() == digest
    except OSError:
        return False
