"""Client options for a secured Kafka (R18), built once from :class:`~streamapp.settings.KafkaSecurity`
for every client: aiokafka's keyword arguments (:func:`client_options`), Faust's
``broker_credentials`` (:func:`broker_credentials`), Java client properties
(:func:`java_properties`, for the Kafka Streams benchmark) and librdkafka's configuration
(:func:`librdkafka_config`, for confluent-kafka clients such as the Quix Streams benchmark).

OAUTHBEARER tokens come from an OAuth 2 token endpoint by the client-credentials grant
(:class:`ClientCredentialsTokens`), fetched once and refreshed before they expire.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

from aiokafka.abc import AbstractTokenProvider

from streamapp.errors import ExitCode, StreamappError, one_line
from streamapp.settings import KafkaSecurity, Secret, Settings, SettingsError, shown_url

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

# A token is fetched again once this share of its lifetime has passed, so a connection made
# just before it expires still carries a valid one.
REFRESH_AT = 0.8
# Lifetime assumed when the endpoint does not say (expires_in is only RECOMMENDED by RFC 6749).
DEFAULT_TOKEN_LIFETIME_S = 300.0
# After a failed refresh, the token still valid is used and a new one asked for again this much later.
REFRESH_RETRY_S = 5.0

log = logging.getLogger(__name__)


class TokenEndpointError(StreamappError, RuntimeError):
    """The OAuth token endpoint gave no token."""

    exit_code = ExitCode.AUTH_FAILED


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: urllib would send the client secret's Authorization header on to
    wherever the endpoint points, another host or plain http included."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the redirect as an HTTPError


_OPENER = urllib.request.build_opener(_NoRedirects)


class ClientCredentialsTokens(AbstractTokenProvider):
    """OAUTHBEARER tokens from ``url`` by the OAuth 2 client-credentials grant (RFC 6749 4.4).

    One token serves every connection until REFRESH_AT of its lifetime; the fetch runs on a
    thread (urllib), under a lock, so clients on different event loops (the worker's output
    thread) share it and fetch it once. A refresh that fails while the token is still valid
    logs a warning and keeps it, asking again REFRESH_RETRY_S later: only with no valid token
    does a failed fetch raise."""

    def __init__(self, url: str, client_id: str, secret: Secret, scope: str | None = None, *,
                 timeout_s: float = 10.0) -> None:
        self.url = url
        self.client_id = client_id
        self.secret = secret
        self.scope = scope
        self.timeout_s = timeout_s
        self.fetches = 0
        self._lock = threading.Lock()
        self._token: str | None = None
        self._refresh_at = 0.0
        self._expires_at = 0.0

    async def token(self) -> str:
        if self._token is not None and time.monotonic() < self._refresh_at:
            return self._token
        return await asyncio.to_thread(self._fresh_token)

    def _fresh_token(self) -> str:
        with self._lock:
            now = time.monotonic()
            if self._token is not None and now < self._refresh_at:
                return self._token
            try:
                token, lifetime_s = self._fetch()
            except TokenEndpointError as exc:
                if self._token is None or now >= self._expires_at:
                    raise
                self._refresh_at = min(now + REFRESH_RETRY_S, self._expires_at)
                log.warning("%s; the current token, valid %.0f s more, is kept and a new one asked for in %.0f s",
                            one_line(exc), self._expires_at - now, self._refresh_at - now)
                return self._token
            self._token, self._refresh_at, self._expires_at = token, now + REFRESH_AT * lifetime_s, now + lifetime_s
            self.fetches += 1
            return token

    def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        # Client authentication by HTTP Basic, which RFC 6749 2.3.1 requires every server to accept.
        basic = f"{urllib.parse.quote(self.client_id)}:{urllib.parse.quote(self.secret.value)}"
        request = urllib.request.Request(self.url, data=urllib.parse.urlencode(form).encode(), method="POST", headers={
            "Authorization": f"Basic {base64.b64encode(basic.encode()).decode()}",
            "Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"})
        fix = ("check STREAMAPP_OAUTH_TOKEN_URL, STREAMAPP_OAUTH_CLIENT_ID, STREAMAPP_OAUTH_CLIENT_SECRET "
               "and STREAMAPP_OAUTH_SCOPE")
        what = f"the OAuth token endpoint {shown_url(self.url)} gave client {self.client_id!r} no token"
        try:
            # An http(s) URL: KafkaSecurity checks it.
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read(1024**2))
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise TokenEndpointError(f"{what}: HTTP {exc.code}, a redirect to {self._host_of(exc.headers)}",
                                         "tokens are not fetched across redirects: set STREAMAPP_OAUTH_TOKEN_URL to "
                                         "the endpoint itself") from None
            raise TokenEndpointError(f"{what}: HTTP {exc.code} {exc.reason}", fix) from None
        except (OSError, ValueError) as exc:
            raise TokenEndpointError(f"{what}: {exc}", fix) from None
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise TokenEndpointError(f"{what}: its answer has no access_token", fix)
        lifetime = body.get("expires_in", DEFAULT_TOKEN_LIFETIME_S)
        known = isinstance(lifetime, int | float) and lifetime > 0
        return token, float(lifetime) if known else DEFAULT_TOKEN_LIFETIME_S


    def _host_of(self, headers: Any) -> str:
        """The host and port a redirect's Location names (its path and query may hold secrets)."""
        try:
            location = urllib.parse.urlsplit(urllib.parse.urljoin(self.url, headers.get("Location", "")))
            return f"{location.hostname}:{location.port}" if location.port else str(location.hostname)
        except ValueError:
            return "a malformed Location"


@functools.cache
def ssl_context(security: KafkaSecurity) -> ssl.SSLContext | None:
    """The TLS context of every client of this process (None without TLS): the broker's
    certificate checked against STREAMAPP_SSL_CA_FILE (the system's CAs when unset), its name
    against the host connected to unless STREAMAPP_SSL_CHECK_HOSTNAME is false."""
    if not security.uses_tls:
        return None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=security.ca_file)
    except ssl.SSLError as exc:
        raise SettingsError(f"STREAMAPP_SSL_CA_FILE={str(security.ca_file)!r} holds no CA certificate in PEM: "
                            f"{getattr(exc, 'reason', None) or exc}") from None
    context.check_hostname = security.check_hostname
    if security.cert_file is not None:
        password = None if security.key_password is None else security.key_password.value
        try:
            context.load_cert_chain(security.cert_file, security.key_file, password)
        except ssl.SSLError as exc:
            raise SettingsError(f"STREAMAPP_SSL_CERT_FILE / STREAMAPP_SSL_KEY_FILE cannot be loaded "
                                f"({getattr(exc, 'reason', None) or exc}): they must be a PEM certificate and its key "
                                "(STREAMAPP_SSL_KEY_PASSWORD if the key is encrypted)") from None
    return context


@functools.cache
def token_provider(security: KafkaSecurity) -> ClientCredentialsTokens | None:
    """One token provider per process and security block, so its clients share one token."""
    if security.mechanism != "OAUTHBEARER":
        return None
    assert security.token_url and security.client_id and security.client_secret  # checked by KafkaSecurity
    return ClientCredentialsTokens(security.token_url, security.client_id, security.client_secret, security.scope)


def security_options(security: KafkaSecurity) -> dict[str, Any]:
    """aiokafka's keyword arguments for ``security`` (any client: consumer, producer, admin)."""
    options: dict[str, Any] = {"security_protocol": security.protocol}
    if security.uses_tls:
        options["ssl_context"] = ssl_context(security)
    if security.mechanism == "OAUTHBEARER":
        options.update(sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=token_provider(security))
    elif security.mechanism is not None:
        assert security.password is not None  # checked by KafkaSecurity
        options.update(sasl_mechanism=security.mechanism, sasl_plain_username=security.username,
                       sasl_plain_password=security.password.value)
    return options


def client_options(settings: Settings) -> dict[str, Any]:
    """``bootstrap_servers`` and the security options for an aiokafka client of ``settings``."""
    return {"bootstrap_servers": settings.bootstrap_servers, **security_options(settings.security)}


def broker_credentials(security: KafkaSecurity) -> CredentialsT | None:
    """Faust's ``broker_credentials`` for ``security`` (None for PLAINTEXT). Faust hands them to
    every aiokafka client it makes, the same options as :func:`security_options`."""
    from faust.auth import OAuthCredentials, SASLCredentials, SSLCredentials  # Faust's import takes 0.6 s

    context = ssl_context(security)
    if security.mechanism == "OAUTHBEARER":
        provider = token_provider(security)
        assert provider is not None
        return OAuthCredentials(oauth_cb=provider, ssl_context=context)
    if security.mechanism is not None:
        assert security.password is not None
        return SASLCredentials(username=security.username, password=security.password.value,
                               ssl_context=context, mechanism=security.mechanism)
    if context is not None:
        return SSLCredentials(context)
    return None


def java_properties(security: KafkaSecurity) -> dict[str, str]:
    """The same security as Java client properties (the Kafka Streams benchmark). PEM files are
    read as such by Kafka's clients (ssl.truststore.type=PEM)."""
    properties = {"security.protocol": security.protocol}
    if security.uses_tls:
        if security.ca_file is not None:
            properties.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": str(security.ca_file)})
        if security.cert_file is not None:
            raise SettingsError("the Kafka Streams benchmark does not pass STREAMAPP_SSL_CERT_FILE on: "
                                "run it without a client certificate")
        if not security.check_hostname:
            properties["ssl.endpoint.identification.algorithm"] = ""
    if security.mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        assert security.password is not None
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if security.mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        credentials = f"username={json.dumps(security.username)} password={json.dumps(security.password.value)}"
        properties.update({"sasl.mechanism": security.mechanism,
                           "sasl.jaas.config": f"{module} required {credentials};"})
    elif security.mechanism == "OAUTHBEARER":
        raise SettingsError("the Kafka Streams benchmark does not support STREAMAPP_SASL_MECHANISM=OAUTHBEARER")
    return properties


def librdkafka_config(security: KafkaSecurity) -> dict[str, str]:
    """The same security as librdkafka configuration (confluent-kafka's clients). PEM files are
    read as they are; OAUTHBEARER tokens come from librdkafka's own client-credentials grant
    (``sasl.oauthbearer.method=oidc``) at STREAMAPP_OAUTH_TOKEN_URL."""
    config = {"security.protocol": security.protocol}
    if security.uses_tls:
        config["enable.ssl.certificate.verification"] = "true"
        config["ssl.endpoint.identification.algorithm"] = "https" if security.check_hostname else "none"
        optional = {"ssl.ca.location": security.ca_file, "ssl.certificate.location": security.cert_file,
                    "ssl.key.location": security.key_file,
                    "ssl.key.password": security.key_password.value if security.key_password else None}
        config.update({key: str(value) for key, value in optional.items() if value is not None})
    if security.mechanism == "OAUTHBEARER":
        assert security.token_url and security.client_id and security.client_secret  # checked by KafkaSecurity
        config.update({"sasl.mechanisms": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                       "sasl.oauthbearer.token.endpoint.url": security.token_url,
                       "sasl.oauthbearer.client.id": security.client_id,
                       "sasl.oauthbearer.client.secret": security.client_secret.value})
        if security.scope:
            config["sasl.oauthbearer.scope"] = security.scope
    elif security.mechanism is not None:
        assert security.username is not None and security.password is not None  # checked by KafkaSecurity
        config.update({"sasl.mechanisms": security.mechanism, "sasl.username": security.username,
                       "sasl.password": security.password.value})
    return config
