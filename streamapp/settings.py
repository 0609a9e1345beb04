"""Every setting of a streamapp process, read from ``STREAMAPP_*`` environment variables.

``faust -A streamapp.app worker`` takes no arguments of ours, so the environment is the one
channel that reaches every process the same way (worker, CLI, docker-compose). Each value is
validated when read; a bad one stops the process at start with the variable's name in the message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import math
import os
import re
import socket
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from streamapp.errors import UsageError
from streamapp.memoryplan import decoded_frame_pixels
from streamapp.units import UnitError, milliseconds, parse_bytes, parse_duration

STAGES = ("resize", "infer", "join", "sink")
# What a worker does when its stream buffers are full: stop fetching, or (live video) drop the
# oldest buffered records, counted.
BACKPRESSURE = "backpressure"
DROP_OLDEST = "drop-oldest"
OVERLOAD_POLICIES = (BACKPRESSURE, DROP_OLDEST)
_TOPIC_PREFIX = re.compile(r"[A-Za-z0-9_.-]{0,100}")
_TOKEN = re.compile(r"[!-~]*")


# Faust's names; docs/exactly-once.md says what exactly-once holds (streamapp.kafka.transactions).
AT_LEAST_ONCE = "at_least_once"
EXACTLY_ONCE = "exactly_once"
PROCESSING_GUARANTEES = (AT_LEAST_ONCE, EXACTLY_ONCE)
# The transactional producers' transaction.timeout.ms (aiokafka's default): an open transaction
# older than this is aborted by the broker.
TRANSACTION_TIMEOUT_S = 60.0
# A worker's log lines: Faust's text, or one JSON object per line (streamapp.worker.logs).
LOG_FORMATS = ("text", "json")
# A worker's consumer heartbeats this often; its session timeout (STREAMAPP_SESSION_TIMEOUT) spans
# at least three heartbeats (also brokers' default group.min.session.timeout.ms) and at most
# Faust's broker request timeout, which Faust does not let it exceed.
HEARTBEAT_INTERVAL_S = 2.0
SESSION_TIMEOUT_MIN_S = 3 * HEARTBEAT_INTERVAL_S
SESSION_TIMEOUT_MAX_S = 90.0


class SettingsError(UsageError, ValueError):
    """A setting that is missing, malformed or inconsistent with another."""


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@dataclasses.dataclass(frozen=True)
class Secret:
    """A password or client secret: shown as ``***`` in every repr and log line. ``file`` is where
    it was read from, so another process is handed the file, not the value."""

    value: str = dataclasses.field(repr=False)
    file: Path | None = None

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def is_loopback(host: str) -> bool:
    """``host`` (an address or a name, IPv6 with or without brackets) is this host only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


MALFORMED_URL = "<a malformed URL>"


def shown_url(url: str) -> str:
    """``url`` as it may be logged or shown: credentials before the host, every query value and
    any fragment replaced by ``***`` (a password or token written into the URL stays out of logs,
    error lines and web pages); the scheme, host, port, path and query names kept to locate it."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is no number
    except ValueError:
        return MALFORMED_URL
    host = parts.netloc.rpartition("@")[2]
    query = "&".join(f"{name}=***" if equals else "***"
                     for name, equals, _ in (field.partition("=") for field in parts.query.split("&") if field))
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}" if "@" in parts.netloc else host,
                                                  query=query, fragment="***" if parts.fragment else ""))


@dataclasses.dataclass(frozen=True)
class KafkaSecurity:
    """How every client of this process connects to Kafka: TLS, SASL, OAUTHBEARER (R18).

    streamapp.kafkasecurity turns it into aiokafka's and Faust's options; docs/operations.md
    lists the variables."""

    protocol: str = "PLAINTEXT"
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    key_password: Secret | None = None
    check_hostname: bool = True
    mechanism: str | None = None
    username: str | None = None
    password: Secret | None = None
    token_url: str | None = None
    client_id: str | None = None
    client_secret: Secret | None = None
    scope: str | None = None

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def __post_init__(self) -> None:
        _require(self.protocol in SECURITY_PROTOCOLS,
                 f"STREAMAPP_SECURITY_PROTOCOL={self.protocol!r}: choose one of {', '.join(SECURITY_PROTOCOLS)}")
        if self.mechanism is not None:
            _require(self.mechanism in SASL_MECHANISMS,
                     f"STREAMAPP_SASL_MECHANISM={self.mechanism!r}: choose one of {', '.join(SASL_MECHANISMS)}")
        self._check_tls()
        self._check_sasl()

    def _check_tls(self) -> None:
        tls = {"STREAMAPP_SSL_CA_FILE": self.ca_file, "STREAMAPP_SSL_CERT_FILE": self.cert_file,
               "STREAMAPP_SSL_KEY_FILE": self.key_file, "STREAMAPP_SSL_KEY_PASSWORD": self.key_password}
        if not self.uses_tls:
            given = [name for name, value in tls.items() if value is not None]
            _require(not given, f"{', '.join(given)} set, but STREAMAPP_SECURITY_PROTOCOL={self.protocol} does not "
                                "use TLS: set STREAMAPP_SECURITY_PROTOCOL=SSL or SASL_SSL, or unset them")
            return
        _require((self.cert_file is None) == (self.key_file is None),
                 "STREAMAPP_SSL_CERT_FILE and STREAMAPP_SSL_KEY_FILE go together: a client certificate needs its key")
        _require(self.key_password is None or self.key_file is not None,
                 "STREAMAPP_SSL_KEY_PASSWORD is set without STREAMAPP_SSL_KEY_FILE")
        for name in ("STREAMAPP_SSL_CA_FILE", "STREAMAPP_SSL_CERT_FILE", "STREAMAPP_SSL_KEY_FILE"):
            path = tls[name]
            if isinstance(path, Path):
                _readable(path, name)

    def _check_sasl(self) -> None:
        sasl = {"STREAMAPP_SASL_USERNAME": self.username, "STREAMAPP_SASL_PASSWORD": self.password,
                "STREAMAPP_OAUTH_TOKEN_URL": self.token_url, "STREAMAPP_OAUTH_CLIENT_ID": self.client_id,
                "STREAMAPP_OAUTH_CLIENT_SECRET": self.client_secret, "STREAMAPP_OAUTH_SCOPE": self.scope}
        if not self.uses_sasl:
            given = [name for name, value in {"STREAMAPP_SASL_MECHANISM": self.mechanism, **sasl}.items()
                     if value is not None]
            _require(not given, f"{', '.join(given)} set, but STREAMAPP_SECURITY_PROTOCOL={self.protocol} does not "
                                "use SASL: set STREAMAPP_SECURITY_PROTOCOL=SASL_SSL or SASL_PLAINTEXT, or unset them")
            return
        _require(self.mechanism is not None,
                 f"STREAMAPP_SECURITY_PROTOCOL={self.protocol} needs STREAMAPP_SASL_MECHANISM: "
                 f"one of {', '.join(SASL_MECHANISMS)}")
        needed: tuple[str, ...]
        wrong: tuple[str, ...]
        if self.mechanism == "OAUTHBEARER":
            needed = ("STREAMAPP_OAUTH_TOKEN_URL", "STREAMAPP_OAUTH_CLIENT_ID", "STREAMAPP_OAUTH_CLIENT_SECRET")
            wrong = ("STREAMAPP_SASL_USERNAME", "STREAMAPP_SASL_PASSWORD")
        else:
            needed = ("STREAMAPP_SASL_USERNAME", "STREAMAPP_SASL_PASSWORD")
            wrong = ("STREAMAPP_OAUTH_TOKEN_URL", "STREAMAPP_OAUTH_CLIENT_ID", "STREAMAPP_OAUTH_CLIENT_SECRET",
                     "STREAMAPP_OAUTH_SCOPE")
        missing = [name for name in needed if sasl[name] is None]
        _require(not missing, f"STREAMAPP_SASL_MECHANISM={self.mechanism} needs {', '.join(missing)}"
                              " (a secret may also come from its ..._FILE variable)")
        extra = [name for name in wrong if sasl[name] is not None]
        _require(not extra, f"{', '.join(extra)} set, but STREAMAPP_SASL_MECHANISM={self.mechanism} does not use them")
        if self.token_url is not None:
            shown = shown_url(self.token_url)
            _require(self.token_url.startswith(("https://", "http://")) and shown != MALFORMED_URL,
                     f"STREAMAPP_OAUTH_TOKEN_URL={shown!r} is not an http(s) URL")
            # The client secret goes in the request: in clear text only to this host.
            _require(self.token_url.startswith("https://")
                     or is_loopback(urllib.parse.urlsplit(self.token_url).hostname or ""),
                     f"STREAMAPP_OAUTH_TOKEN_URL={shown!r} is plain http to another host, which would send the "
                     "client secret in clear text: use its https:// URL")
            _require("@" not in urllib.parse.urlsplit(self.token_url).netloc,
                     f"STREAMAPP_OAUTH_TOKEN_URL={shown!r} holds credentials before its host: give them as "
                     "STREAMAPP_OAUTH_CLIENT_ID and STREAMAPP_OAUTH_CLIENT_SECRET(_FILE) instead")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KafkaSecurity:
        def text(name: str) -> str | None:
            return env.get(name) or None

        def path(name: str) -> Path | None:
            value = text(name)
            return None if value is None else Path(value)

        protocol = (text("STREAMAPP_SECURITY_PROTOCOL") or "PLAINTEXT").strip().upper()
        mechanism = text("STREAMAPP_SASL_MECHANISM")
        check_hostname = text("STREAMAPP_SSL_CHECK_HOSTNAME")
        try:
            hostname = True if check_hostname is None else _bool(check_hostname, "STREAMAPP_SSL_CHECK_HOSTNAME")
        except ValueError as exc:
            raise SettingsError(f"STREAMAPP_SSL_CHECK_HOSTNAME={check_hostname!r}: {exc}") from None
        return cls(protocol=protocol, ca_file=path("STREAMAPP_SSL_CA_FILE"), cert_file=path("STREAMAPP_SSL_CERT_FILE"),
                   key_file=path("STREAMAPP_SSL_KEY_FILE"), key_password=_secret(env, "STREAMAPP_SSL_KEY_PASSWORD"),
                   check_hostname=hostname, mechanism=None if mechanism is None else mechanism.strip().upper(),
                   username=text("STREAMAPP_SASL_USERNAME"), password=_secret(env, "STREAMAPP_SASL_PASSWORD"),
                   token_url=text("STREAMAPP_OAUTH_TOKEN_URL"), client_id=text("STREAMAPP_OAUTH_CLIENT_ID"),
                   client_secret=_secret(env, "STREAMAPP_OAUTH_CLIENT_SECRET"), scope=text("STREAMAPP_OAUTH_SCOPE"))

    def to_env(self) -> dict[str, str]:
        """The variables that give another process this security; a secret read from a file is
        handed on as its file."""
        env = {"STREAMAPP_SECURITY_PROTOCOL": self.protocol}
        if self.uses_tls:
            env["STREAMAPP_SSL_CHECK_HOSTNAME"] = str(self.check_hostname).lower()
        plain = {"STREAMAPP_SSL_CA_FILE": self.ca_file, "STREAMAPP_SSL_CERT_FILE": self.cert_file,
                 "STREAMAPP_SSL_KEY_FILE": self.key_file, "STREAMAPP_SASL_MECHANISM": self.mechanism,
                 "STREAMAPP_SASL_USERNAME": self.username, "STREAMAPP_OAUTH_TOKEN_URL": self.token_url,
                 "STREAMAPP_OAUTH_CLIENT_ID": self.client_id, "STREAMAPP_OAUTH_SCOPE": self.scope}
        env.update({name: str(value) for name, value in plain.items() if value is not None})
        secrets = {"STREAMAPP_SSL_KEY_PASSWORD": self.key_password, "STREAMAPP_SASL_PASSWORD": self.password,
                   "STREAMAPP_OAUTH_CLIENT_SECRET": self.client_secret}
        for name, secret in secrets.items():
            if secret is not None:
                if secret.file is not None:
                    env[f"{name}_FILE"] = str(secret.file)
                else:
                    env[name] = secret.value
        return env


def _readable(path: Path, name: str) -> None:
    try:
        with path.open("rb") as file:
            file.read(1)
    except OSError as exc:
        raise SettingsError(f"{name}={str(path)!r} cannot be read: {exc.strerror or exc}") from None


def _secret(env: Mapping[str, str], name: str) -> Secret | None:
    """``name`` itself, or the contents of the file ``name_FILE`` names (one trailing newline
    dropped, as a mounted secret often has one)."""
    value, file = env.get(name) or None, env.get(f"{name}_FILE") or None
    if value is not None and file is not None:
        raise SettingsError(f"{name} and {name}_FILE are both set: keep one")
    if file is None:
        return None if value is None else Secret(value)
    path = Path(file)
    _readable(path, f"{name}_FILE")
    text = path.read_text().removesuffix("\n").removesuffix("\r")
    if not text:
        raise SettingsError(f"{name}_FILE={file!r} is empty")
    return Secret(text, path)


def _int(raw: str, name: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number") from None


def _float(raw: str, name: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number")
    return value


def _names(raw: str, name: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def parse_stages(raw: str, name: str) -> tuple[str, ...]:
    """Stage names, comma-separated, in the order given (it names the worker's group), or ``all``."""
    if raw.strip() == "all":
        return STAGES
    return _names(raw, name)


_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _bool(raw: str, name: str) -> bool:
    try:
        return _BOOLEANS[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"{name} must be true or false (or 1/0, yes/no, on/off)") from None


def _size(raw: str, name: str) -> int:
    return parse_bytes(raw, name=name)


def _duration(raw: str, name: str) -> float:
    return parse_duration(raw, name=name)


def _text(raw: str, name: str) -> str:
    return raw


def _path(raw: str, name: str) -> Path:
    return Path(raw)


def parse_resolution(raw: str, name: str = "resolution") -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", raw)
    if not match:
        raise ValueError(f"{name}: {raw!r} is not WIDTHxHEIGHT, e.g. 320x240")
    return int(match.group(1)), int(match.group(2))


@dataclasses.dataclass(frozen=True)
class VariableKind:
    """How a setting's variable is read (``parse(raw, variable)``) and written back for another process."""

    parse: Callable[[str, str], Any]
    show: Callable[[Any], str] = str


_TEXT, _INT, _FLOAT, _SIZE, _BOOL, _PATH = (VariableKind(parse) for parse in (_text, _int, _float, _size, _bool, _path))
_DURATION = VariableKind(_duration, lambda seconds: f"{seconds}s")
_NAMES = VariableKind(_names, ",".join)
_STAGES = VariableKind(parse_stages, ",".join)


def _variable(name: str, kind: VariableKind, default: Any) -> Any:
    """A field of :class:`Settings` read from the environment variable ``name``."""
    return dataclasses.field(default=default, metadata={"variable": (name, kind)})


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of a process. A field read from the environment names its variable and how it is
    read and written back (:func:`_variable`): the one list that from_env, to_env and the docs' check use."""

    broker: str = _variable("STREAMAPP_BROKER", _TEXT, "kafka://127.0.0.1:9092")
    app_id: str = _variable("STREAMAPP_APP_ID", _TEXT, "streamapp")
    topic_prefix: str = _variable("STREAMAPP_TOPIC_PREFIX", _TEXT, "")
    stages: tuple[str, ...] = _variable("STREAMAPP_STAGES", _STAGES, STAGES)
    partitions: int = _variable("STREAMAPP_PARTITIONS", _INT, 4)
    bucket_size: int = _variable("STREAMAPP_BUCKET_SIZE", _INT, 900)
    join_ttl_s: float = _variable("STREAMAPP_JOIN_TTL", _DURATION, 5.0)
    sweep_interval_s: float = _variable("STREAMAPP_SWEEP_INTERVAL", _DURATION, 1.0)
    # How long "already joined / already expired" is remembered, so late results are counted
    # as late instead of waiting a TTL as orphans.
    done_marker_ttl_s: float = _variable("STREAMAPP_DONE_MARKER_TTL", _DURATION, 60.0)
    max_frame_bytes: int = _variable("STREAMAPP_MAX_FRAME_BYTES", _SIZE, 16 * 1024**2)
    memory_budget_bytes: int = _variable("STREAMAPP_MEMORY_BUDGET", _SIZE, 1024**3)
    # Pixels of the largest frame a stage decodes; 0 is all that its share of the memory budget holds.
    max_frame_pixels: int = _variable("STREAMAPP_MAX_FRAME_PIXELS", _INT, 0)
    overload: str = _variable("STREAMAPP_OVERLOAD", _TEXT, BACKPRESSURE)
    # Bytes the worker's tables may take on disk; near it the oldest pending entries expire early.
    disk_budget_bytes: int = _variable("STREAMAPP_DISK_BUDGET", _SIZE, 4 * 1024**3)
    # Free space kept on the join's and the sink's file systems: below it they pause.
    disk_reserve_bytes: int = _variable("STREAMAPP_DISK_RESERVE", _SIZE, 64 * 1024**2)
    # The broker's log for all the pipeline's topics; split into retention per partition.
    broker_disk_budget_bytes: int = _variable("STREAMAPP_BROKER_DISK_BUDGET", _SIZE, 24 * 1024**3)
    # The sink's frames and video segments, all streams together; past it the oldest files are deleted.
    sink_disk_budget_bytes: int = _variable("STREAMAPP_SINK_DISK_BUDGET", _SIZE, 2 * 1024**3)
    input_retention_s: float = _variable("STREAMAPP_INPUT_RETENTION", _DURATION, 3600.0)
    data_dir: Path = _variable("STREAMAPP_DATA_DIR", _PATH, Path("data"))
    out_dir: Path = _variable("STREAMAPP_OUT_DIR", _PATH, Path("out"))
    web_port: int = _variable("STREAMAPP_WEB_PORT", _INT, 6066)
    # The address the web port listens on: this host only unless told otherwise (0.0.0.0: every interface).
    web_bind: str = _variable("STREAMAPP_WEB_BIND", _TEXT, "127.0.0.1")
    # A bearer token every web route but the health checks asks for; empty asks none. Never printed.
    # Read by from_env as a secret (STREAMAPP_WEB_TOKEN or its _FILE), like the security settings.
    web_token: str = dataclasses.field(default="", repr=False)
    # Both from STREAMAPP_RESIZE (WIDTHxHEIGHT).
    resize_width: int = 320
    resize_height: int = 240
    jpeg_quality: int = _variable("STREAMAPP_JPEG_QUALITY", _INT, 90)
    detector: str = _variable("STREAMAPP_DETECTOR", _TEXT, "color")
    # YOLOv3-tiny (STREAMAPP_DETECTOR=yolo): square network input in pixels, the lowest class
    # score kept, the overlap above which non-maximum suppression drops the weaker box, and the
    # COCO classes kept (all when empty).
    yolo_input: int = _variable("STREAMAPP_YOLO_INPUT", _INT, 416)
    yolo_confidence: float = _variable("STREAMAPP_YOLO_CONFIDENCE", _FLOAT, 0.25)
    yolo_nms: float = _variable("STREAMAPP_YOLO_NMS", _FLOAT, 0.45)
    yolo_classes: tuple[str, ...] = _variable("STREAMAPP_YOLO_CLASSES", _NAMES, ())
    # Most frames the infer stage hands its detector at once when frames are waiting.
    infer_batch: int = _variable("STREAMAPP_INFER_BATCH", _INT, 4)
    processing_guarantee: str = _variable("STREAMAPP_PROCESSING_GUARANTEE", _TEXT, AT_LEAST_ONCE)
    # Under exactly-once, how long a partition's transaction spans batches before it commits.
    transaction_interval_s: float = _variable("STREAMAPP_TRANSACTION_INTERVAL", _DURATION, 0.1)
    # Copies of every topic partition, changelogs included: 3 on a three-broker cluster.
    replication_factor: int = _variable("STREAMAPP_REPLICATION_FACTOR", _INT, 1)
    # Static consumer-group membership: a worker restarted within the session timeout takes its
    # partitions back at once, without a rebalance (see docs/operations.md for the trade-off).
    static_membership: bool = _variable("STREAMAPP_STATIC_MEMBERSHIP", _BOOL, True)
    # How long the group waits for a worker that stopped answering before its partitions move on.
    session_timeout_s: float = _variable("STREAMAPP_SESSION_TIMEOUT", _DURATION, 10.0)
    # Latest annotated frame per stream kept for the sink's live preview page; 0 turns it off.
    preview_bytes: int = _variable("STREAMAPP_PREVIEW_BYTES", _SIZE, 32 * 1024**2)
    log_format: str = _variable("STREAMAPP_LOG_FORMAT", _TEXT, "text")
    security: KafkaSecurity = dataclasses.field(default_factory=lambda: KafkaSecurity())

    def __post_init__(self) -> None:
        unknown = set(self.stages) - set(STAGES)
        if unknown or not self.stages:
            raise SettingsError(
                f"STREAMAPP_STAGES: unknown stage(s) {sorted(unknown)}; choose from {', '.join(STAGES)}"
            )
        if not _TOPIC_PREFIX.fullmatch(self.topic_prefix):
            raise SettingsError(f"STREAMAPP_TOPIC_PREFIX: {self.topic_prefix!r} is not a valid topic prefix")
        # Kafka takes no credentials in its bootstrap servers; the value is not echoed, it would show them.
        _require("@" not in self.broker, "STREAMAPP_BROKER holds credentials (user:password@): give them as "
                                         "STREAMAPP_SASL_USERNAME and STREAMAPP_SASL_PASSWORD(_FILE) instead")
        _require(self.partitions >= 1, "STREAMAPP_PARTITIONS must be >= 1")
        _require(self.bucket_size >= 1, "STREAMAPP_BUCKET_SIZE must be >= 1")
        _require(self.replication_factor >= 1, "STREAMAPP_REPLICATION_FACTOR must be >= 1")
        _require(self.preview_bytes >= 0, "STREAMAPP_PREVIEW_BYTES must be >= 0")
        _require(self.join_ttl_s > 0, "STREAMAPP_JOIN_TTL must be > 0")
        _require(0 < self.sweep_interval_s <= self.join_ttl_s,
                 "STREAMAPP_SWEEP_INTERVAL must be > 0 and no longer than the join TTL")
        _require(self.done_marker_ttl_s >= self.join_ttl_s,
                 "STREAMAPP_DONE_MARKER_TTL must be at least the join TTL")
        _require(64 * 1024 <= self.max_frame_bytes <= 256 * 1024**2,
                 "STREAMAPP_MAX_FRAME_BYTES must be between 64KiB and 256MiB")
        _require(0 <= self.max_frame_pixels <= self.budget_frame_pixels,
                 f"STREAMAPP_MAX_FRAME_PIXELS can only lower the {self.budget_frame_pixels} pixels "
                 f"STREAMAPP_MEMORY_BUDGET allows; raise the budget for larger frames")
        _require(self.overload in OVERLOAD_POLICIES,
                 f"STREAMAPP_OVERLOAD must be one of {', '.join(OVERLOAD_POLICIES)}")
        _require(self.disk_budget_bytes >= 64 * 1024**2 + 4 * self.max_frame_bytes,
                 "STREAMAPP_DISK_BUDGET must be at least 64MiB plus 4 frames of STREAMAPP_MAX_FRAME_BYTES")
        _require(self.sink_disk_budget_bytes >= 8 * self.max_frame_bytes,
                 "STREAMAPP_SINK_DISK_BUDGET must hold at least 8 frames of STREAMAPP_MAX_FRAME_BYTES")
        _require(1 <= self.jpeg_quality <= 100, "STREAMAPP_JPEG_QUALITY must be 1..100")
        _require(self.resize_width >= 16 and self.resize_height >= 16,
                 "STREAMAPP_RESIZE must be at least 16x16")
        _require(0 < self.web_port < 65536, "STREAMAPP_WEB_PORT must be a TCP port")
        _require(bool(self.web_bind.strip()), "STREAMAPP_WEB_BIND must be an address, e.g. 127.0.0.1 or 0.0.0.0")
        _require(_TOKEN.fullmatch(self.web_token) is not None,
                 "STREAMAPP_WEB_TOKEN must be printable ASCII without spaces")
        # Darknet's YOLO downsamples by 32.
        _require(self.yolo_input % 32 == 0 and 128 <= self.yolo_input <= 1024,
                 f"STREAMAPP_YOLO_INPUT must be a multiple of 32 from 128 to 1024, got {self.yolo_input}")
        _require(0 < self.yolo_confidence < 1, "STREAMAPP_YOLO_CONFIDENCE must be between 0 and 1 (exclusive)")
        _require(0 < self.yolo_nms <= 1, "STREAMAPP_YOLO_NMS must be > 0 and at most 1")
        _require(1 <= self.infer_batch <= 64, "STREAMAPP_INFER_BATCH must be 1..64")
        _require(self.processing_guarantee in PROCESSING_GUARANTEES,
                 f"STREAMAPP_PROCESSING_GUARANTEE must be one of {', '.join(PROCESSING_GUARANTEES)}")
        _require(self.transaction_interval_s < TRANSACTION_TIMEOUT_S,
                 f"STREAMAPP_TRANSACTION_INTERVAL must be shorter than the transaction timeout "
                 f"({TRANSACTION_TIMEOUT_S:g}s), e.g. 100ms; 0ms commits every batch")
        _require(SESSION_TIMEOUT_MIN_S <= self.session_timeout_s <= SESSION_TIMEOUT_MAX_S,
                 f"STREAMAPP_SESSION_TIMEOUT must be {SESSION_TIMEOUT_MIN_S:g}s to {SESSION_TIMEOUT_MAX_S:g}s: "
                 f"at least three heartbeats, at most the consumer's request timeout")
        _require(self.log_format in LOG_FORMATS, f"STREAMAPP_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}")

    def check_worker(self) -> None:
        """What a worker of these stages needs beyond the settings each stage needs: under
        exactly-once, no two of its stages commit the offsets of the same input (resize and join
        both read frames, each committing in its own transactions)."""
        _require(self.processing_guarantee != EXACTLY_ONCE or not {"resize", "join"} <= set(self.stages),
                 "STREAMAPP_PROCESSING_GUARANTEE=exactly_once: resize and join both read frames and commit "
                 "its offsets; run them in separate workers (STREAMAPP_STAGES)")

    @property
    def join_ttl_ms(self) -> int:
        return milliseconds(self.join_ttl_s)

    @property
    def done_marker_ttl_ms(self) -> int:
        return milliseconds(self.done_marker_ttl_s)

    @property
    def input_retention_ms(self) -> int:
        return milliseconds(self.input_retention_s)

    @property
    def budget_frame_pixels(self) -> int:
        """Pixels of the largest frame whose decoding fits its share of the memory budget
        (streamapp.memoryplan)."""
        return decoded_frame_pixels(self.memory_budget_bytes)

    @property
    def frame_pixel_limit(self) -> int:
        """Pixels of the largest frame a stage decodes."""
        return self.max_frame_pixels or self.budget_frame_pixels

    @property
    def group_id(self) -> str:
        """Consumer group of this process: one per stage set, so stages scale independently."""
        stages = "all" if set(self.stages) == set(STAGES) else "-".join(self.stages)
        return f"{self.topic_prefix}{self.app_id}-{stages}"

    def group_instance_id(self, web_url: str) -> str | None:
        """This worker's static member name (``group.instance.id``), or None for dynamic membership.

        It must stay the same across restarts of one worker and differ between workers, or the
        broker fences one of them: the data dir (every worker on a host has its own, RocksDB
        locks it) and the web URL (host and port) say which worker this is. The URL is part of it
        also because Faust refuses an assignment made for another URL, and a static member that
        rejoins is handed its previous assignment.
        """
        if not self.static_membership:
            return None
        host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:64]
        where = hashlib.sha256(f"{self.data_dir.resolve()} {web_url}".encode()).hexdigest()[:12]
        return f"{self.group_id}.{host}.{where}"

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.removeprefix("kafka://")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        values: dict = {}
        for field, (variable, kind) in _ENV.items():
            raw = env.get(variable)
            if raw is None or raw == "":
                continue
            try:
                values[field] = kind.parse(raw, variable)
            except (UnitError, ValueError) as exc:
                reason = str(exc).removeprefix(f"{variable}: ").removeprefix(f"{variable} ")
                raise SettingsError(f"{variable}={raw!r}: {reason}") from None
        if env.get("STREAMAPP_RESIZE"):
            try:
                values["resize_width"], values["resize_height"] = parse_resolution(
                    env["STREAMAPP_RESIZE"], "STREAMAPP_RESIZE")
            except ValueError as exc:
                raise SettingsError(str(exc)) from None
        web_token = _secret(env, "STREAMAPP_WEB_TOKEN")
        if web_token is not None:
            values["web_token"] = web_token.value
        return cls(**values, security=KafkaSecurity.from_env(env))

    def to_env(self) -> dict[str, str]:
        """The environment that makes another process read these same settings."""
        env = {}
        for field, (variable, kind) in _ENV.items():
            env[variable] = kind.show(getattr(self, field))
        env["STREAMAPP_RESIZE"] = f"{self.resize_width}x{self.resize_height}"
        if self.web_token:
            env["STREAMAPP_WEB_TOKEN"] = self.web_token
        return {**env, **self.security.to_env()}

    def replace(self, **changes) -> Settings:
        return dataclasses.replace(self, **changes)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SettingsError(message)


# Each field read from the environment, with its variable and kind.
_ENV: dict[str, tuple[str, VariableKind]] = {
    field.name: field.metadata["variable"] for field in dataclasses.fields(Settings) if "variable" in field.metadata}
