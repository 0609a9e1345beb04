"""The connection security block (STREAMAPP_SECURITY_PROTOCOL and the rest): validated at start in
one line, secrets never shown, the same options for aiokafka, Faust, Java and librdkafka; the
OAUTHBEARER token provider against a real HTTP token endpoint started here."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from streamapp import kafkasecurity
from streamapp.connect import client_certificate_refused, connection_error
from streamapp.errors import (
    AuthenticationFailed,
    CertificateUntrusted,
    ClientCertificateRefused,
    ExitCode,
    HandshakeFailed,
    HostnameMismatch,
    MechanismRefused,
)
from streamapp.kafka import client as kafkaclient
from streamapp.kafkasecurity import ClientCredentialsTokens, TokenEndpointError
from streamapp.settings import Secret, Settings, SettingsError, shown_url

SCRAM = {"STREAMAPP_SECURITY_PROTOCOL": "SASL_SSL", "STREAMAPP_SASL_MECHANISM": "SCRAM-SHA-512",
         "STREAMAPP_SASL_USERNAME": "pipeline", "STREAMAPP_SASL_PASSWORD": "hunter2-secret"}
OAUTH = {"STREAMAPP_SECURITY_PROTOCOL": "SASL_SSL", "STREAMAPP_SASL_MECHANISM": "OAUTHBEARER",
         "STREAMAPP_OAUTH_TOKEN_URL": "https://login.example/token", "STREAMAPP_OAUTH_CLIENT_ID": "streamapp",
         "STREAMAPP_OAUTH_CLIENT_SECRET": "hunter2-secret"}


@pytest.mark.parametrize("env, phrase", [
    ({"STREAMAPP_SECURITY_PROTOCOL": "TLS"}, "choose one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ({"STREAMAPP_SECURITY_PROTOCOL": "SASL_SSL"}, "SASL_SSL needs STREAMAPP_SASL_MECHANISM: one of PLAIN, "
                                                  "SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER"),
    ({**SCRAM, "STREAMAPP_SASL_MECHANISM": "GSSAPI"}, "STREAMAPP_SASL_MECHANISM='GSSAPI': choose one of PLAIN"),
    ({**SCRAM, "STREAMAPP_SASL_PASSWORD": ""}, "SCRAM-SHA-512 needs STREAMAPP_SASL_PASSWORD"),
    ({**OAUTH, "STREAMAPP_OAUTH_CLIENT_SECRET": ""}, "OAUTHBEARER needs STREAMAPP_OAUTH_CLIENT_SECRET"),
    ({**OAUTH, "STREAMAPP_OAUTH_TOKEN_URL": "file:///etc/passwd"}, "is not an http(s) URL"),
    ({**OAUTH, "STREAMAPP_OAUTH_TOKEN_URL": "http://login.example/token?k=hunter4"},
     "TOKEN_URL='http://login.example/token?k=***' is plain http to another host, which would send the client "
     "secret in clear text: use its https:// URL"),
    ({**OAUTH, "STREAMAPP_OAUTH_TOKEN_URL": "http://127.0.0.1.nip.example/token"}, "is plain http to another host"),
    ({**OAUTH, "STREAMAPP_OAUTH_TOKEN_URL": "https://[login.example/token"}, "'<a malformed URL>' is not an http"),
    ({"STREAMAPP_BROKER": "kafka://me:hunter2@broker:9092"}, "STREAMAPP_BROKER holds credentials (user:password@)"),
    ({**OAUTH, "STREAMAPP_OAUTH_TOKEN_URL": "https://me:hunter3@login.example/token?k=hunter4"},
     "TOKEN_URL='https://***@login.example/token?k=***' holds credentials before its host: give them as "
     "STREAMAPP_OAUTH_CLIENT_ID and STREAMAPP_OAUTH_CLIENT_SECRET"),
    ({**SCRAM, "STREAMAPP_OAUTH_CLIENT_ID": "x"}, "STREAMAPP_OAUTH_CLIENT_ID set, but STREAMAPP_SASL_MECHANISM="),
    ({"STREAMAPP_SASL_MECHANISM": "PLAIN"}, "STREAMAPP_SECURITY_PROTOCOL=PLAINTEXT does not use SASL"),
    ({"STREAMAPP_SSL_CA_FILE": "/etc/hostname"}, "STREAMAPP_SECURITY_PROTOCOL=PLAINTEXT does not use TLS"),
    ({"STREAMAPP_SECURITY_PROTOCOL": "SSL", "STREAMAPP_SSL_CA_FILE": "/nonexistent/ca.pem"},
     "STREAMAPP_SSL_CA_FILE='/nonexistent/ca.pem' cannot be read: No such file"),
    ({"STREAMAPP_SECURITY_PROTOCOL": "SSL", "STREAMAPP_SSL_CERT_FILE": "/etc/hostname"},
     "STREAMAPP_SSL_CERT_FILE and STREAMAPP_SSL_KEY_FILE go together"),
    ({"STREAMAPP_SECURITY_PROTOCOL": "SSL", "STREAMAPP_SSL_CHECK_HOSTNAME": "maybe"},
     "STREAMAPP_SSL_CHECK_HOSTNAME='maybe'"),
    ({**SCRAM, "STREAMAPP_SASL_PASSWORD_FILE": "/etc/hostname"}, "STREAMAPP_SASL_PASSWORD and "
                                                                 "STREAMAPP_SASL_PASSWORD_FILE are both set"),
    ({**SCRAM, "STREAMAPP_SASL_PASSWORD": "", "STREAMAPP_SASL_PASSWORD_FILE": "/nonexistent"},
     "STREAMAPP_SASL_PASSWORD_FILE='/nonexistent' cannot be read"),
])
def test_a_bad_security_setting_is_one_line_naming_it_and_exits_2(env, phrase):
    with pytest.raises(SettingsError) as refused:
        Settings.from_env(env)
    assert phrase in str(refused.value) and "\n" not in str(refused.value)
    assert not {"hunter2", "hunter3", "hunter4"} & set(re.findall(r"hunter\d", str(refused.value)))
    assert refused.value.exit_code == ExitCode.USAGE


def test_a_file_that_holds_no_pem_certificate_is_refused_when_the_options_are_built(tmp_path):
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    settings = Settings.from_env({"STREAMAPP_SECURITY_PROTOCOL": "SSL", "STREAMAPP_SSL_CA_FILE": str(not_pem)})
    with pytest.raises(SettingsError, match="holds no CA certificate in PEM"):
        kafkasecurity.client_options(settings)


def test_secrets_come_from_files_and_never_show_in_repr_or_str(tmp_path):
    password_file = tmp_path / "password"
    password_file.write_text("from-a-file-secret\n")
    env = {**SCRAM, "STREAMAPP_SASL_PASSWORD": "", "STREAMAPP_SASL_PASSWORD_FILE": str(password_file)}
    settings = Settings.from_env(env)
    assert settings.security.password == Secret("from-a-file-secret", password_file)
    for shown in (repr(settings), str(settings), repr(settings.security), f"{settings.security.password}"):
        assert "from-a-file-secret" not in shown
    # Another process is handed the file, not the secret; and reads the same settings back.
    handed_on = settings.to_env()
    assert handed_on["STREAMAPP_SASL_PASSWORD_FILE"] == str(password_file)
    assert "from-a-file-secret" not in json.dumps(handed_on)
    assert Settings.from_env(handed_on) == settings
    inline = Settings.from_env(SCRAM)
    assert Settings.from_env(inline.to_env()) == inline and "hunter2-secret" not in repr(inline)


def test_aiokafka_options_carry_the_mechanism_user_and_a_tls_context_checking_the_hostname():
    options = kafkasecurity.client_options(Settings.from_env({**SCRAM, "STREAMAPP_BROKER": "kafka://k:9093"}))
    context = options.pop("ssl_context")
    assert options == {"bootstrap_servers": "k:9093", "security_protocol": "SASL_SSL",
                       "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "pipeline",
                       "sasl_plain_password": "hunter2-secret"}
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    unchecked = Settings.from_env({"STREAMAPP_SECURITY_PROTOCOL": "SSL", "STREAMAPP_SSL_CHECK_HOSTNAME": "false"})
    assert not kafkasecurity.client_options(unchecked)["ssl_context"].check_hostname
    assert kafkasecurity.client_options(Settings())["security_protocol"] == "PLAINTEXT"


@pytest.mark.parametrize("env", [{}, {"STREAMAPP_SECURITY_PROTOCOL": "SSL"}, SCRAM,
                                 {**SCRAM, "STREAMAPP_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, OAUTH])
def test_fausts_credentials_give_its_clients_the_same_options_as_ours(env):
    security = Settings.from_env(env).security
    faust_options = credentials_to_aiokafka_auth(kafkasecurity.broker_credentials(security))
    # ssl_context=None is aiokafka's default.
    assert {key: value for key, value in faust_options.items() if value is not None} == \
        kafkasecurity.security_options(security)


def test_java_properties_carry_the_same_security():
    properties = kafkasecurity.java_properties(Settings.from_env({**SCRAM, "STREAMAPP_SSL_CA_FILE": "/etc/hostname"})
                                               .security)
    assert properties["security.protocol"] == "SASL_SSL" and properties["sasl.mechanism"] == "SCRAM-SHA-512"
    assert properties["ssl.truststore.location"] == "/etc/hostname"
    assert properties["sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                              'username="pipeline" password="hunter2-secret";')


@pytest.mark.parametrize("env, expected", [
    ({}, {"security.protocol": "PLAINTEXT"}),
    ({**SCRAM, "STREAMAPP_SSL_CA_FILE": "/etc/hostname"},
     {"security.protocol": "SASL_SSL", "enable.ssl.certificate.verification": "true",
      "ssl.endpoint.identification.algorithm": "https", "ssl.ca.location": "/etc/hostname",
      "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "pipeline", "sasl.password": "hunter2-secret"}),
    ({"STREAMAPP_SECURITY_PROTOCOL": "SSL", "STREAMAPP_SSL_CHECK_HOSTNAME": "false",
      "STREAMAPP_SSL_CERT_FILE": "/etc/hostname", "STREAMAPP_SSL_KEY_FILE": "/etc/hosts",
      "STREAMAPP_SSL_KEY_PASSWORD": "key-secret"},
     {"security.protocol": "SSL", "enable.ssl.certificate.verification": "true",
      "ssl.endpoint.identification.algorithm": "none", "ssl.certificate.location": "/etc/hostname",
      "ssl.key.location": "/etc/hosts", "ssl.key.password": "key-secret"}),
    ({**SCRAM, "STREAMAPP_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "STREAMAPP_SASL_MECHANISM": "PLAIN"},
     {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN", "sasl.username": "pipeline",
      "sasl.password": "hunter2-secret"}),
    ({**OAUTH, "STREAMAPP_OAUTH_SCOPE": "kafka"},
     {"security.protocol": "SASL_SSL", "enable.ssl.certificate.verification": "true",
      "ssl.endpoint.identification.algorithm": "https", "sasl.mechanisms": "OAUTHBEARER",
      "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.token.endpoint.url": "https://login.example/token",
      "sasl.oauthbearer.client.id": "streamapp", "sasl.oauthbearer.client.secret": "hunter2-secret",
      "sasl.oauthbearer.scope": "kafka"}),
])
def test_librdkafka_config_carries_the_same_security(env, expected):
    assert kafkasecurity.librdkafka_config(Settings.from_env(env).security) == expected


def verification_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message}")
    error.verify_code, error.verify_message = code, message
    return error


@pytest.mark.parametrize("error, kind, phrases", [
    (verification_error(62, "Hostname mismatch, certificate is not valid for '127.0.0.1'."), HostnameMismatch,
     ["does not name '127.0.0.1'", "STREAMAPP_SSL_CHECK_HOSTNAME"]),
    (verification_error(20, "unable to get local issuer certificate"), CertificateUntrusted,
     ["not trusted (unable to get local issuer certificate)", "STREAMAPP_SSL_CA_FILE"]),
    (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), HandshakeFailed,
     ["TLS with broker 127.0.0.1:9093 failed", "STREAMAPP_SECURITY_PROTOCOL"]),
])
def test_a_connections_failure_is_named_with_the_setting_to_check(error, kind, phrases):
    named = connection_error(Settings.from_env(SCRAM), "127.0.0.1:9093", error)
    assert isinstance(named, kind)
    for phrase in phrases:
        assert phrase in str(named)
    assert connection_error(Settings(), "127.0.0.1:9093", ConnectionRefusedError(111, "refused")) is None


def test_sasl_failures_name_broker_mechanism_and_user_but_not_the_password():
    from aiokafka.errors import SaslAuthenticationFailed, UnsupportedSaslMechanismError
    settings = Settings.from_env(SCRAM)
    refused = connection_error(settings, "k:9093", SaslAuthenticationFailed("invalid credentials"))
    assert isinstance(refused, AuthenticationFailed) and refused.exit_code == ExitCode.AUTH_FAILED
    assert "k:9093 refused SASL SCRAM-SHA-512 authentication of user 'pipeline'" in str(refused)
    assert "hunter2" not in str(refused)
    unsupported = connection_error(settings, "k:9093", UnsupportedSaslMechanismError(
        "Kafka broker does not support SCRAM-SHA-512 sasl mechanism. Enabled mechanisms are: ['PLAIN']"))
    assert isinstance(unsupported, MechanismRefused) and "(it offers ['PLAIN'])" in str(unsupported)


def test_a_tls_alert_about_the_client_certificate_names_the_settings_to_check(tmp_path):
    tls = {"STREAMAPP_SECURITY_PROTOCOL": "SSL"}
    missing = client_certificate_refused(Settings.from_env(tls), "localhost:9093", "SSLV3_ALERT_BAD_CERTIFICATE")
    assert isinstance(missing, ClientCertificateRefused) and missing.exit_code == ExitCode.CLIENT_CERTIFICATE_REFUSED
    assert str(missing) == ("the broker localhost:9093 requires a client certificate and none was sent "
                            "(SSLV3_ALERT_BAD_CERTIFICATE) — set STREAMAPP_SSL_CERT_FILE and STREAMAPP_SSL_KEY_FILE "
                            "(and STREAMAPP_SSL_KEY_PASSWORD_FILE if the key is encrypted)")
    (tmp_path / "cert.pem").write_text("")
    with_cert = Settings.from_env({**tls, "STREAMAPP_SSL_CERT_FILE": str(tmp_path / "cert.pem"),
                                   "STREAMAPP_SSL_KEY_FILE": str(tmp_path / "cert.pem")})
    refused = client_certificate_refused(with_cert, "localhost:9093", "SSLV3_ALERT_CERTIFICATE_UNKNOWN")
    assert f"refused the client certificate STREAMAPP_SSL_CERT_FILE={tmp_path / 'cert.pem'}" in str(refused)
    assert client_certificate_refused(with_cert, "localhost:9093", "SSLV3_ALERT_HANDSHAKE_FAILURE") is None
    assert client_certificate_refused(with_cert, "localhost:9093", None) is None


class TokenEndpoint:
    """A real OAuth 2 token endpoint on a free local port: client ``streamapp`` with secret
    ``s3cret``; each token is ``token-<n>``, valid ``lifetime_s``. ``failing``: it answers 503;
    ``redirect_to``: it answers 302 to there. Every request, of any method, is kept."""

    def __init__(self, lifetime_s: float = 3600) -> None:
        self.lifetime_s = lifetime_s
        self.requests: list[dict] = []
        self.failing = False
        self.redirect_to: str | None = None
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint.requests.append({"method": "GET", "auth": self.headers.get("Authorization")})
                self.send_response(405)
                self.end_headers()

            def do_POST(self) -> None:
                form = dict(urllib.parse.parse_qsl(self.rfile.read(int(self.headers["Content-Length"])).decode()))
                auth = base64.b64decode(self.headers.get("Authorization", "Basic ").split()[-1]).decode()
                endpoint.requests.append({**form, "auth": auth})
                if endpoint.redirect_to or endpoint.failing:
                    self.send_response(302 if endpoint.redirect_to else 503)
                    if endpoint.redirect_to:
                        self.send_header("Location", endpoint.redirect_to)
                    self.end_headers()
                    return
                if auth != "streamapp:s3cret" or form.get("grant_type") != "client_credentials":
                    self.send_response(401, "Unauthorized")
                    self.end_headers()
                    return
                body = json.dumps({"access_token": f"token-{len(endpoint.requests)}", "token_type": "bearer",
                                   "expires_in": endpoint.lifetime_s}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def token_endpoint():
    endpoint = TokenEndpoint()
    yield endpoint
    endpoint.close()


def test_the_token_provider_fetches_once_by_client_credentials_and_reuses_the_token(token_endpoint):
    tokens = ClientCredentialsTokens(token_endpoint.url, "streamapp", Secret("s3cret"), "kafka.write")

    async def three_connections():
        return await asyncio.gather(tokens.token(), tokens.token(), tokens.token())

    assert asyncio.run(three_connections()) == ["token-1"] * 3
    assert token_endpoint.requests == [{"grant_type": "client_credentials", "scope": "kafka.write",
                                        "auth": "streamapp:s3cret"}]


def test_the_token_provider_refreshes_at_80_percent_of_the_lifetime(token_endpoint):
    token_endpoint.lifetime_s = 1.0
    tokens = ClientCredentialsTokens(token_endpoint.url, "streamapp", Secret("s3cret"))
    assert asyncio.run(tokens.token()) == "token-1"
    time.sleep(0.5)
    assert asyncio.run(tokens.token()) == "token-1"  # at half its life: still the same
    time.sleep(0.4)
    assert asyncio.run(tokens.token()) == "token-2"  # past 80 %: a new one, before the old expires
    assert tokens.fetches == 2


def test_a_refresh_that_fails_keeps_the_valid_token_and_only_an_expired_one_fails(token_endpoint, caplog):
    token_endpoint.lifetime_s = 2.0
    tokens = ClientCredentialsTokens(token_endpoint.url, "streamapp", Secret("s3cret"))
    assert asyncio.run(tokens.token()) == "token-1"
    token_endpoint.failing = True
    time.sleep(1.7)  # past 80 % of its life, not past its end
    with caplog.at_level(logging.WARNING, logger="streamapp.kafkasecurity"):
        assert asyncio.run(tokens.token()) == "token-1"
    [warning] = caplog.records
    assert "HTTP 503" in warning.getMessage() and "the current token, valid " in warning.getMessage()
    time.sleep(0.4)  # expired now
    with pytest.raises(TokenEndpointError, match="HTTP 503"):
        asyncio.run(tokens.token())
    token_endpoint.failing = False
    assert asyncio.run(tokens.token()) == "token-4"


def test_a_redirect_is_not_followed_so_the_client_secret_goes_nowhere_else(token_endpoint):
    elsewhere = TokenEndpoint()
    try:
        token_endpoint.redirect_to = f"{elsewhere.url}?code=hunter6"
        tokens = ClientCredentialsTokens(token_endpoint.url, "streamapp", Secret("s3cret"))
        with pytest.raises(TokenEndpointError) as redirected:
            asyncio.run(tokens.token())
        assert elsewhere.requests == []
    finally:
        elsewhere.close()
    message = str(redirected.value)
    port = urllib.parse.urlsplit(elsewhere.url).port
    assert f"gave client 'streamapp' no token: HTTP 302, a redirect to 127.0.0.1:{port} — tokens are not fetched " \
           "across redirects" in message
    assert "hunter6" not in message and "s3cret" not in message and message.count("\n") == 0


def test_a_refused_client_is_one_line_naming_the_endpoint_and_client_not_the_secret(token_endpoint):
    tokens = ClientCredentialsTokens(token_endpoint.url, "streamapp", Secret("wrong-secret"))
    with pytest.raises(TokenEndpointError) as refused:
        asyncio.run(tokens.token())
    message = str(refused.value)
    assert f"the OAuth token endpoint {token_endpoint.url} gave client 'streamapp' no token: HTTP 401" in message
    assert "wrong-secret" not in message and refused.value.exit_code == ExitCode.AUTH_FAILED


@pytest.mark.parametrize("url, shown", [
    ("https://login.example/oauth2/token", "https://login.example/oauth2/token"),
    ("https://user:pa%40ss@login.example:8443/token", "https://***@login.example:8443/token"),
    ("https://only-a-token@login.example/token", "https://***@login.example/token"),
    ("https://login.example/token?api-version=2&code=abc&flag&=x", "https://login.example/token?"
     "api-version=***&code=***&***&=***"),
    ("http://127.0.0.1:8080/t#access_token=abc", "http://127.0.0.1:8080/t#***"),
    ("https://a:b@[::1]:99/t?x=y", "https://***@[::1]:99/t?x=***"),
    ("https://login.example:notaport/token?secret=1", "<a malformed URL>"),
    ("https://[::1/token", "<a malformed URL>"),
])
def test_a_url_is_shown_without_its_credentials_query_values_or_fragment(url, shown):
    assert shown_url(url) == shown


def test_the_token_endpoints_error_shows_its_url_without_the_query_token(token_endpoint):
    tokens = ClientCredentialsTokens(f"{token_endpoint.url}?api-key=hunter5", "streamapp", Secret("wrong"))
    with pytest.raises(TokenEndpointError) as refused:
        asyncio.run(tokens.token())
    assert f"the OAuth token endpoint {token_endpoint.url}?api-key=*** gave client 'streamapp' no token: HTTP 401" \
        in str(refused.value) and "hunter5" not in str(refused.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/token", "http://localhost/token", "http://[::1]:80/t",
                                 "https://login.example/token"])
def test_a_token_url_is_https_or_on_this_host(url):
    assert Settings.from_env({**OAUTH, "STREAMAPP_OAUTH_TOKEN_URL": url}).security.token_url == url


def test_oauthbearer_settings_give_every_client_one_shared_token_provider():
    first = kafkasecurity.client_options(Settings.from_env(OAUTH))["sasl_oauth_token_provider"]
    second = kafkasecurity.client_options(Settings.from_env(OAUTH))["sasl_oauth_token_provider"]
    assert isinstance(first, ClientCredentialsTokens) and first is second



def test_aiokafkas_debug_log_shows_sasl_exchanges_without_their_bytes(caplog):
    """The OAUTHBEARER token as aiokafka's connection logs its request and the broker's answer
    (the PLAIN password against a real broker: tests/integration/test_secure_broker.py)."""
    from aiokafka.protocol.admin import SaslAuthenticateRequest_v1, SaslAuthenticateResponse_v1

    kafkaclient.install()
    request = SaslAuthenticateRequest_v1(b"n,,\x01auth=Bearer tok-hunter7\x01\x01")
    answer = SaslAuthenticateResponse_v1(0, None, b"tok-hunter7", 60_000)
    with caplog.at_level(logging.DEBUG, logger="aiokafka.conn"):
        logging.getLogger("aiokafka.conn").debug("Request to %s:%d %d: %s", "localhost", 9093, 7, request)
        logging.getLogger("aiokafka.conn").debug("Response from %s:%d %d: %s", "localhost", 9093, 7, answer)
        logging.getLogger("aiokafka.conn").debug("Request to %s:%d %d: %s", "localhost", 9093, 8, "Metadata")
    assert [record.getMessage() for record in caplog.records] == [
        "Request to localhost:9093 7: SaslAuthenticateRequest_v1(***)",
        "Response from localhost:9093 7: SaslAuthenticateResponse_v1(***)",
        "Request to localhost:9093 8: Metadata"]
