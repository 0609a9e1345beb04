"""Starting an aiokafka client, with one clear error for each way a connection fails (R18):
no broker answers, the broker refused the user or its mechanism, its certificate is not trusted
or does not name the host, it refused the client certificate (or got none), an ACL is missing.

aiokafka reports every failure to bootstrap as one ``KafkaConnectionError`` (having logged the
cause); :func:`diagnose` then opens one connection by aiokafka's ``create_conn`` with the same
options, which raises the cause itself, and names it. A broker that refuses the client's
certificate ends TLS with an alert that aiokafka reports as a closed connection; a TLS
connection of our own reads that alert.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterator
from typing import Protocol, TypeVar

from aiokafka import errors as kafka_errors
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import KafkaConnectionError

from streamapp.errors import (
    AuthenticationFailed,
    BrokerUnreachable,
    CertificateUntrusted,
    ClientCertificateRefused,
    HandshakeFailed,
    HostnameMismatch,
    MechanismRefused,
    NotAuthorized,
    StreamappError,
)
from streamapp.kafkasecurity import security_options
from streamapp.settings import Settings
from streamapp.units import milliseconds

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and _IP_ADDRESS_MISMATCH: the certificate is trusted
# but names other hosts.
_NAME_MISMATCH = (62, 64)
# The TLS alerts of a server that got no client certificate, or one it does not trust (Kafka's
# Java sends bad_certificate and certificate_unknown; TLS 1.3 defines certificate_required).
_CLIENT_CERTIFICATE_ALERTS = ("SSLV3_ALERT_BAD_CERTIFICATE", "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
                              "TLSV13_ALERT_CERTIFICATE_REQUIRED", "TLSV1_ALERT_UNKNOWN_CA")


class KafkaClient(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


Client = TypeVar("Client", bound=KafkaClient)


def not_authorized(settings: Settings, operation: str, resource: str) -> NotAuthorized:
    """A missing ACL, named with the principal the broker sees and the brokers asked."""
    return NotAuthorized(principal(settings), operation, resource, settings.bootstrap_servers)


def principal(settings: Settings) -> str:
    """Who the broker sees, as its ACLs name it."""
    security = settings.security
    if security.mechanism == "OAUTHBEARER":
        return f"OAuth client {security.client_id!r}"
    if security.mechanism is not None:
        return f"User:{security.username}"
    return "the client certificate's principal" if security.cert_file else "User:ANONYMOUS"


@contextlib.contextmanager
def acl_errors_named(settings: Settings, *, operation: str, topics: str) -> Iterator[None]:
    """Within it, Kafka's answer that an ACL is missing is raised as :class:`~streamapp.errors.NotAuthorized`
    (an idempotent producer on a broker before Kafka 2.8 also needs IDEMPOTENT_WRITE on the cluster)."""
    try:
        yield
    except kafka_errors.TopicAuthorizationFailedError:
        raise not_authorized(settings, operation, f"topic {topics}") from None
    except kafka_errors.ClusterAuthorizationFailedError:
        raise not_authorized(settings, "IDEMPOTENT_WRITE", "the cluster") from None


@contextlib.contextmanager
def quiet_logger(logger_name: str) -> Iterator[None]:
    """Silence a logger while connecting to a broker that may refuse: the caller reports it once."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


async def start_client(client: Client, settings: Settings) -> Client:
    """Start ``client``; when it cannot connect, close it and raise what went wrong."""
    try:
        with quiet_logger("aiokafka"):
            await client.start()
    except KafkaConnectionError:
        # Closed here, or aiokafka reports an "Unclosed AIOKafkaProducer" at exit.
        await client.stop()
        raise await diagnose(settings) from None
    except StreamappError:  # the OAuth token endpoint gave no token
        await client.stop()
        raise
    return client


async def diagnose(settings: Settings, timeout_s: float = 15.0) -> StreamappError:
    """Why no client of ``settings`` could bootstrap: one connection per bootstrap server, with
    the same options; the first failure of security is named, else no broker answers."""
    options = security_options(settings.security)
    for host, port, _ in collect_hosts(settings.bootstrap_servers, randomize=False):
        try:
            with quiet_logger("aiokafka"):
                connection = await asyncio.wait_for(
                    create_conn(host, port, request_timeout_ms=milliseconds(timeout_s), **options), timeout_s)
        except StreamappError as exc:  # the OAuth token endpoint's failure
            return exc
        except (OSError, kafka_errors.KafkaError) as exc:  # TimeoutError is an OSError
            named = connection_error(settings, f"{host}:{port}", exc)
            if isinstance(named, HandshakeFailed) and settings.security.uses_tls:
                alert = await tls_alert(host, port, options["ssl_context"], min(timeout_s, 5.0))
                named = client_certificate_refused(settings, f"{host}:{port}", alert) or named
            if named is not None:
                return named
        else:
            connection.close()
    return BrokerUnreachable(settings.bootstrap_servers)


async def tls_alert(host: str, port: int, context: ssl.SSLContext, timeout_s: float) -> str | None:
    """The TLS alert with which ``host:port`` ends a connection right after the handshake (as a
    server refusing the client's certificate does under TLS 1.3), or None."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, server_hostname=host), timeout_s)
    except (OSError, TimeoutError):
        return None
    try:
        await asyncio.wait_for(reader.read(1), timeout_s)
    except ssl.SSLError as exc:
        return exc.reason
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()
    return None


def client_certificate_refused(settings: Settings, broker: str, alert: str | None) -> StreamappError | None:
    """The broker's TLS ``alert`` named, if it says it wants (another) client certificate."""
    if alert not in _CLIENT_CERTIFICATE_ALERTS:
        return None
    cert_file = settings.security.cert_file
    if cert_file is None:
        return ClientCertificateRefused(
            f"the broker {broker} requires a client certificate and none was sent ({alert})",
            "set STREAMAPP_SSL_CERT_FILE and STREAMAPP_SSL_KEY_FILE (and STREAMAPP_SSL_KEY_PASSWORD_FILE "
            "if the key is encrypted)")
    return ClientCertificateRefused(
        f"the broker {broker} refused the client certificate STREAMAPP_SSL_CERT_FILE={cert_file} ({alert})",
        "use a certificate signed by a CA the broker trusts (its ssl.truststore)")


def connection_error(settings: Settings, broker: str, error: BaseException) -> StreamappError | None:
    """The failure of one connection to ``broker`` named, or None when nobody answered there."""
    security = settings.security
    if isinstance(error, kafka_errors.SaslAuthenticationFailed | kafka_errors.AuthenticationFailedError):
        if security.mechanism == "OAUTHBEARER":
            return AuthenticationFailed(
                f"the broker {broker} refused the OAUTHBEARER token of client {security.client_id!r}",
                "check STREAMAPP_OAUTH_TOKEN_URL, STREAMAPP_OAUTH_CLIENT_ID and STREAMAPP_OAUTH_SCOPE, and that "
                "the broker trusts that token endpoint")
        return AuthenticationFailed(
            f"the broker {broker} refused SASL {security.mechanism} authentication of user {security.username!r}",
            "check STREAMAPP_SASL_USERNAME, STREAMAPP_SASL_PASSWORD (or STREAMAPP_SASL_PASSWORD_FILE) and "
            "STREAMAPP_SASL_MECHANISM")
    if isinstance(error, kafka_errors.UnsupportedSaslMechanismError):
        offered = str(error).rpartition("Enabled mechanisms are:")[2].strip() or "others"
        return MechanismRefused(f"the broker {broker} does not offer SASL mechanism {security.mechanism} "
                                f"(it offers {offered})", "set STREAMAPP_SASL_MECHANISM to one it offers")
    if isinstance(error, ssl.SSLCertVerificationError):
        if error.verify_code in _NAME_MISMATCH:
            host = broker.rpartition(":")[0]
            return HostnameMismatch(
                f"the TLS certificate of broker {broker} does not name {host!r} ({error.verify_message})",
                "connect by a name the certificate holds (STREAMAPP_BROKER), or, knowing the risk, "
                "set STREAMAPP_SSL_CHECK_HOSTNAME=false")
        where = (f"STREAMAPP_SSL_CA_FILE={security.ca_file} did not sign it" if security.ca_file
                 else "STREAMAPP_SSL_CA_FILE is unset, so only the system's CAs are trusted")
        return CertificateUntrusted(f"the TLS certificate of broker {broker} is not trusted "
                                    f"({error.verify_message}): {where}",
                                    "set STREAMAPP_SSL_CA_FILE to the PEM file of the CA that signed it")
    if isinstance(error, ssl.SSLError):
        return HandshakeFailed(f"TLS with broker {broker} failed ({getattr(error, 'reason', None) or error})",
                               f"check that its listener speaks {security.protocol} (STREAMAPP_SECURITY_PROTOCOL)")
    if isinstance(error, OSError) and not isinstance(error, ConnectionResetError):
        return None  # nobody listens there
    return HandshakeFailed(f"the broker {broker} answered but closed the connection during the handshake "
                           f"({type(error).__name__}: {error})",
                           f"check that its listener speaks {security.protocol} (STREAMAPP_SECURITY_PROTOCOL) and "
                           "STREAMAPP_SASL_MECHANISM")
