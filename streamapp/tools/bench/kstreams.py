"""The Kafka Streams join of ``streamapp bench join``: built from ``kstreams/`` (a pom and one Java
source) the way the broker's jars are fetched, and run as its own JVM.

Maven copies the runtime dependencies once; ``javac`` compiles the source against them. Both land
in ``~/.cache/streamapp/kstreams-join-<hash>``, keyed by the pom and the source, so a changed file
builds again and an unchanged one is reused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from streamapp.kafkasecurity import java_properties
from streamapp.settings import Settings
from streamapp.tools.localkafka.common import BrokerError, Notify, write_private
from streamapp.tools.localkafka.jars import check_java, copy_maven_dependencies

KAFKA_STREAMS_VERSION = "4.4.0"
SOURCE_DIR = Path(__file__).with_name("kstreams")
JAVA_SOURCE = SOURCE_DIR / "src" / "main" / "java" / "streamapp" / "bench" / "KStreamsJoin.java"
MAIN_CLASS = "streamapp.bench.KStreamsJoin"
JVM_OPTIONS = ["-Xms256m", "-Xmx1g", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"]
READY_MARKER = "STATE RUNNING"
ROCKSDB_BYTES = "ROCKSDB_BYTES "


def last_rocksdb_bytes(log_path: Path) -> int | None:
    """The latest RocksDB size the join printed (memtables + SST files of its stores)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    at = text.rfind(ROCKSDB_BYTES)
    if at < 0:
        return None
    line = text[at + len(ROCKSDB_BYTES):].split("\n", 1)[0].strip()
    return int(line) if line.isdigit() else None


def build_home() -> Path:
    pom, source = (SOURCE_DIR / "pom.xml").read_bytes(), JAVA_SOURCE.read_bytes()
    digest = hashlib.sha256(pom + b"\0" + source).hexdigest()[:16]
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "streamapp" / f"kstreams-join-{digest}"


def ensure_build(notify: Notify | None = None) -> Path:
    """The build directory (``libs/`` and ``classes/``), built on first use; BrokerError if not."""
    home = build_home()
    copy_maven_dependencies(
        (SOURCE_DIR / "pom.xml").read_bytes(), home, what=f"the Kafka Streams {KAFKA_STREAMS_VERSION} jars",
        expected_jar=f"kafka-streams-{KAFKA_STREAMS_VERSION}.jar",
        cache_hint="set XDG_CACHE_HOME to a writable directory", notify=notify)
    classes = home / "classes"
    if not (classes / ".complete").exists():
        _compile(home, classes)
    return home


def _compile(home: Path, classes: Path) -> None:
    javac = shutil.which("javac")
    if not javac:
        raise BrokerError("`javac` not found: building the Kafka Streams join needs a JDK 17+, not only a JRE")
    scratch = Path(tempfile.mkdtemp(prefix="classes-", dir=home))
    proc = subprocess.run([javac, "-d", str(scratch), "-cp", f"{home / 'libs'}/*", str(JAVA_SOURCE)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise BrokerError(f"javac could not compile {JAVA_SOURCE.name}:\n{proc.stderr[-3000:]}")
    (scratch / ".complete").write_text("compiled\n")
    shutil.rmtree(classes, ignore_errors=True)
    os.replace(scratch, classes)


def command(home: Path, *, bootstrap: str, application_id: str, frames: str, results: str, output: str,
            state_dir: Path, window_ms: int, client_properties: Path) -> list[str]:
    classpath = f"{home / 'classes'}:{home / 'libs'}/*"
    return [check_java(), *JVM_OPTIONS, "-cp", classpath, MAIN_CLASS, bootstrap, application_id,
            frames, results, output, str(state_dir), str(window_ms), str(client_properties)]


def write_client_properties(settings: Settings, folder: Path) -> Path:
    """The connection's security as a Java properties file, readable by its owner only (it may hold
    a password), for the join's clients."""
    path = folder / "client.properties"
    lines = [f"{key}={_escaped(value)}" for key, value in java_properties(settings.security).items()]
    write_private(path, ("\n".join(lines) + "\n").encode())
    return path


def _escaped(value: str) -> str:
    """A value as java.util.Properties reads it back."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")
