"""Expected failures: one base class, one line for a person, one exit code per kind of failure.

Every failure that a user or an input can cause derives from :class:`StreamappError`. The
``streamapp`` command and the worker print it as ``streamapp: error: <what> — <fix>`` and exit
with its :attr:`~StreamappError.exit_code`; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import enum

# Where the ACLs each stage needs are listed.
ACL_DOC = "docs/operations.md, Kafka ACLs"


class ExitCode(enum.IntEnum):
    """Exit codes of ``streamapp`` and of a worker that refuses to start (docs/operations.md, Errors and exit codes)."""

    FAILURE = 1  # an expected failure with no code of its own (a demo check, a corrupt file, ...)
    USAGE = 2  # a bad flag, a bad STREAMAPP_* setting, a bad size or duration
    NOT_RUNNING = 3  # `streamapp broker status`: no broker runs
    NO_JAVA = 4  # no Java 17+ for the local broker
    NO_MAVEN = 5  # the Kafka jars are missing and Maven is not there to fetch them
    NO_BROKER = 6  # no Kafka broker answers at STREAMAPP_BROKER
    PORT_BUSY = 7  # a port the command must listen on is taken
    NEEDS_ROOT = 8  # `bench disk` mounts file systems, which needs root
    AUTH_FAILED = 9  # the broker refused the SASL user or password, or the OAuth endpoint gave no token
    MECHANISM_REFUSED = 10  # the broker does not offer STREAMAPP_SASL_MECHANISM
    CERTIFICATE_UNTRUSTED = 11  # the broker's certificate is not signed by a CA we trust
    HOSTNAME_MISMATCH = 12  # the broker's certificate does not name the host connected to
    HANDSHAKE_FAILED = 13  # TLS or SASL failed otherwise: the listener does not speak STREAMAPP_SECURITY_PROTOCOL
    NOT_AUTHORIZED = 14  # an ACL is missing: a topic, the consumer group, the cluster
    TOPICS_MISSING = 15  # topics are missing and this user may not create them
    CONFIG_REFUSED = 16  # the broker refused a topic config (a managed service's cap)
    CLIENT_CERTIFICATE_REFUSED = 17  # the broker requires a client certificate, or does not trust the one sent
    SEAM_MOVED = 18  # a library the project reaches inside is not the version its seams were written for


class StreamappError(Exception):
    """An expected failure. ``str()`` is one line: what went wrong, then how to fix it."""

    exit_code: int = ExitCode.FAILURE

    def __init__(self, what: str = "", fix: str | None = None, *, exit_code: int | None = None) -> None:
        self.what = what
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(f"{what} — {fix}" if fix else what)


def one_line(error: BaseException) -> str:
    """An error's message on one line, as the command prints it."""
    return " ".join(str(error).split())


class UsageError(StreamappError):
    """A bad flag or setting: the person running the command can fix it."""

    exit_code = ExitCode.USAGE


class BrokerUnreachable(StreamappError):
    """No Kafka broker answers at the configured bootstrap servers."""

    exit_code = ExitCode.NO_BROKER

    def __init__(self, bootstrap: str) -> None:
        super().__init__(f"no Kafka broker answers at {bootstrap}",
                         "start one with `streamapp broker start`, or point STREAMAPP_BROKER at a running one")


class SeamMovedError(StreamappError):
    """A library changed under one of the places the project reaches inside it (streamapp.kafka)."""

    exit_code = ExitCode.SEAM_MOVED

    def __init__(self, what: str) -> None:
        super().__init__(what, "install the pinned versions (pip install -c constraints.txt .); "
                               "`streamapp check-upgrade` lists every seam a newer release moves")


class AuthenticationFailed(StreamappError, PermissionError):
    """The broker refused the SASL user or password (or the OAuth token)."""

    exit_code = ExitCode.AUTH_FAILED


class MechanismRefused(StreamappError, PermissionError):
    """The broker does not offer STREAMAPP_SASL_MECHANISM."""

    exit_code = ExitCode.MECHANISM_REFUSED


class CertificateUntrusted(StreamappError, PermissionError):
    """No CA of STREAMAPP_SSL_CA_FILE (or the system's) signed the broker's certificate."""

    exit_code = ExitCode.CERTIFICATE_UNTRUSTED


class HostnameMismatch(StreamappError, PermissionError):
    """The broker's certificate does not name the host connected to."""

    exit_code = ExitCode.HOSTNAME_MISMATCH


class ClientCertificateRefused(StreamappError, PermissionError):
    """The broker requires a client certificate and got none, or does not trust the one sent."""

    exit_code = ExitCode.CLIENT_CERTIFICATE_REFUSED


class HandshakeFailed(StreamappError, ConnectionError):
    """TLS or SASL failed otherwise: most often the listener speaks another protocol."""

    exit_code = ExitCode.HANDSHAKE_FAILED


class NotAuthorized(StreamappError, PermissionError):
    """An ACL is missing: the message names the principal, the operation and the resource."""

    exit_code = ExitCode.NOT_AUTHORIZED

    def __init__(self, principal: str, operation: str, resource: str, bootstrap: str) -> None:
        super().__init__(f"{principal} may not {operation} {resource} on {bootstrap}",
                         f"grant it that ACL (the ACLs each stage needs: {ACL_DOC})")
