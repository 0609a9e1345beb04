"""A local OAuth 2 token endpoint for the secured broker's OAUTHBEARER clients
(``broker start --security sasl_ssl --oauth``), run beside the broker as its own process.

It grants tokens by the client-credentials grant (RFC 6749 4.4) to the broker's users, each a
client whose id is the user's name and whose secret is generated into ``<user>.client-secret``:
an RS256-signed JWT whose ``sub`` is the client id, so the broker's principal is ``User:<id>``
and the SCRAM user's ACLs apply unchanged. The broker checks each token's signature against the
endpoint's JWKS route, its issuer, its audience and its expiry. Plain HTTP on 127.0.0.1: a
local endpoint, like the rest of the local broker, not a production identity provider.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from streamapp.tools.localkafka.common import BrokerError, write_private
from streamapp.tools.localkafka.processes import cmdline_of, free_port, last_error_line, pid_alive, port_in_use

log = logging.getLogger(__name__)

AUDIENCE = "kafka"
SCOPE = "kafka"
TOKEN_PATH = "/oauth2/token"
JWKS_PATH = "/oauth2/jwks"
DEFAULT_TOKEN_LIFETIME_S = 3600.0
_MAX_FORM_BYTES = 64 * 1024


def _content_length(header: str | None) -> int | None:
    """The request body's length, if it is one the endpoint reads (a negative one would read to
    the end of the connection)."""
    try:
        length = int(header or 0)
    except ValueError:
        return None
    return length if 0 <= length <= _MAX_FORM_BYTES else None


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclasses.dataclass(frozen=True)
class TokenEndpoint:
    """The endpoint whose signing key, client secrets, pid, port and log live in ``directory``;
    its tokens are valid ``lifetime_s``."""

    directory: Path
    lifetime_s: float = DEFAULT_TOKEN_LIFETIME_S

    @property
    def signing_key_file(self) -> Path:
        return self.directory / "oauth-signing-key.pem"

    @property
    def pid_file(self) -> Path:
        return self.directory / "oauth-endpoint.pid"

    @property
    def port_file(self) -> Path:
        return self.directory / "oauth-endpoint.port"

    @property
    def log_file(self) -> Path:
        return self.directory / "oauth-endpoint.log"

    def client_secret_file(self, client_id: str) -> Path:
        return self.directory / f"{client_id}.client-secret"

    @property
    def port(self) -> int:
        return int(self.port_file.read_text())

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token_url(self) -> str:
        return self.issuer + TOKEN_PATH

    @property
    def jwks_url(self) -> str:
        return self.issuer + JWKS_PATH

    def ensure(self, client_ids: Iterable[str]) -> None:
        """Generate the signing key and each client's secret, when missing."""
        if not self.signing_key_file.exists():
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            write_private(self.signing_key_file, key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        for client_id in client_ids:
            if not self.client_secret_file(client_id).exists():
                write_private(self.client_secret_file(client_id), secrets.token_urlsafe(24).encode() + b"\n")

    # --- the process --------------------------------------------------------------------------
    def running_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        cmdline = cmdline_of(pid)
        if not pid_alive(pid) or (cmdline is not None and str(self.directory) not in cmdline):
            return None
        return pid

    def start(self, timeout_s: float = 30.0) -> None:
        """Run the endpoint (on the port it had, if free), returning once it serves its JWKS."""
        if self.running_pid() is not None:
            return
        recorded = int(self.port_file.read_text()) if self.port_file.exists() else None
        port = recorded if recorded and not port_in_use(recorded) else free_port()
        self.port_file.write_text(f"{port}\n")
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", __name__, str(self.directory), str(self.lifetime_s)],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(self.jwks_url, timeout=1.0):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        said = last_error_line(self.log_file)
        raise BrokerError(f"the local OAuth token endpoint did not start on port {port}"
                          + (f": {said}" if said else ""), f"its log is {self.log_file}")

    def stop(self, timeout_s: float = 10.0) -> None:
        pid = self.running_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.pid_file.unlink(missing_ok=True)


class Signer:
    """RS256 JWTs of ``endpoint``'s key and their JWKS."""

    def __init__(self, endpoint: TokenEndpoint) -> None:
        key = serialization.load_pem_private_key(endpoint.signing_key_file.read_bytes(), password=None)
        assert isinstance(key, rsa.RSAPrivateKey)
        self.key = key
        self.endpoint = endpoint
        numbers = key.public_key().public_numbers()
        self.jwk = {"kty": "RSA", "use": "sig", "alg": "RS256",
                    "n": b64url(numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")),
                    "e": b64url(numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big"))}
        # RFC 7638's thumbprint of the key names it, so the broker picks it by the token's `kid`.
        thumbprint = json.dumps({name: self.jwk[name] for name in ("e", "kty", "n")}, separators=(",", ":"))
        self.jwk["kid"] = b64url(hashlib.sha256(thumbprint.encode()).digest())

    def token(self, subject: str, now: float) -> str:
        header = {"alg": "RS256", "typ": "JWT", "kid": self.jwk["kid"]}
        claims = {"iss": self.endpoint.issuer, "aud": AUDIENCE, "sub": subject, "scope": SCOPE,
                  "iat": int(now), "exp": int(now + self.endpoint.lifetime_s)}
        signing_input = ".".join(b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims))
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{b64url(signature)}"


def serve(endpoint: TokenEndpoint) -> None:
    """Serve ``endpoint`` until the process is stopped."""
    signer = Signer(endpoint)
    client_secrets = {path.name.removesuffix(".client-secret"): path.read_text().strip()
                      for path in endpoint.directory.glob("*.client-secret")}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == JWKS_PATH:
                self._answer(200, {"keys": [signer.jwk]})
            else:
                self._answer(404, {"error": "not_found"})

        def do_POST(self) -> None:
            length = _content_length(self.headers.get("Content-Length"))
            if self.path != TOKEN_PATH or length is None:
                self._answer(404 if self.path != TOKEN_PATH else 400, {"error": "invalid_request"})
                return
            form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode("utf-8", "replace")))
            client_id, secret = self._client(form)
            expected = client_secrets.get(client_id, "")
            if not expected or not hmac.compare_digest(secret.encode(), expected.encode()):
                log.info("refused client %r: unknown client or wrong secret", client_id)
                self._answer(401, {"error": "invalid_client"})
            elif form.get("grant_type") != "client_credentials":
                self._answer(400, {"error": "unsupported_grant_type"})
            else:
                log.info("issued a token to client %r, valid %gs", client_id, endpoint.lifetime_s)
                self._answer(200, {"access_token": signer.token(client_id, time.time()), "token_type": "Bearer",
                                   "expires_in": int(endpoint.lifetime_s), "scope": SCOPE})

        def _client(self, form: dict[str, str]) -> tuple[str, str]:
            """The client's id and secret: HTTP Basic (RFC 6749 2.3.1), else the form's fields."""
            scheme, _, credentials = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() == "basic":
                try:
                    user, _, secret = base64.b64decode(credentials).decode().partition(":")
                except ValueError:
                    return "", ""
                return urllib.parse.unquote(user), urllib.parse.unquote(secret)
            return form.get("client_id", ""), form.get("client_secret", "")

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # requests are logged above, never a token
            pass

    ThreadingHTTPServer(("127.0.0.1", endpoint.port), Handler).serve_forever()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    serve(TokenEndpoint(Path(sys.argv[1]), float(sys.argv[2])))
