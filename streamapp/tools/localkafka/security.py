"""A local broker secured as a production Kafka is: ``broker start --security sasl_ssl|ssl``.

Clients meet one secured listener, advertised as ``localhost:PORT``: SASL_SSL (SCRAM-SHA-512, or
PLAIN with the same passwords, over TLS; with ``oauth`` also OAUTHBEARER, tokens from the local
endpoint of :mod:`.oauth`), or SSL requiring a client certificate (mutual TLS), the principal being
its common name. At the first start a throwaway CA, a broker certificate naming ``localhost`` only,
a random password per user (``admin``, ``pipeline``) and a client certificate per user, its key
encrypted with that password, are generated into ``<data dir>/security``; the SCRAM users are
written into the metadata log when the storage is formatted, so they belong to that data dir.
Whatever the client listener, a user is the same principal (``User:admin``, ``User:pipeline``), so
the same ACLs apply. Brokers talk to each other on the same listener (as ``admin``, or by the
broker's certificate). The controller listener stays PLAINTEXT on 127.0.0.1: with ACLs on, its
principal (``User:ANONYMOUS``) is a super user, so anyone on this machine who can reach the
controller port is too -- a local broker, not a production one.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import secrets
import shlex
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from streamapp.kafkasecurity import security_options
from streamapp.settings import KafkaSecurity, Settings
from streamapp.tools.localkafka.common import write_private
from streamapp.tools.localkafka.oauth import AUDIENCE, DEFAULT_TOKEN_LIFETIME_S, SCOPE, TokenEndpoint
from streamapp.units import milliseconds

SASL_SSL, MUTUAL_TLS = "sasl_ssl", "ssl"
SECURITY_MODES = ("plaintext", SASL_SSL, MUTUAL_TLS)
SCRAM_MECHANISM = "SCRAM-SHA-512"
ADMIN, PIPELINE = "admin", "pipeline"
USERS = (ADMIN, PIPELINE)
# The only name in the broker certificate: a client that connects to 127.0.0.1 fails the hostname check.
BROKER_HOST = "localhost"
CERTIFICATE_DAYS = 365
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# A certificate's subject "CN=pipeline" is the principal User:pipeline (Kafka's default would be
# "User:CN=pipeline"), the same as the SCRAM user's.
PRINCIPAL_FROM_CN = "RULE:^CN=([^,]+)$/$1/,DEFAULT"
OAUTH_PACKAGE = "org.apache.kafka.common.security.oauthbearer"


@dataclasses.dataclass(frozen=True)
class BrokerSecurity:
    """The TLS material (CA, broker and client certificates) and SCRAM passwords of a secured
    broker (or cluster) in ``directory``.
    ``acls_for``: the StandardAuthorizer on, ``admin`` the only super user besides the
    controllers, and the ``pipeline`` user granted what these settings' pipeline needs.
    ``plaintext_port``: a PLAINTEXT listener on 127.0.0.1 beside it, for local tools whose own
    TLS would share the machine with what they measure (the join benchmark's load and reader).
    Its clients are ``User:ANONYMOUS``, a super user with ACLs on (the controller listener's
    principal too), so any process on this machine that reaches that port passes every ACL.
    ``mode``: the client listener, SASL_SSL or mutual TLS (:data:`SECURITY_MODES`). ``oauth``
    (SASL_SSL only): the listener also takes OAUTHBEARER tokens of a local endpoint, valid
    ``token_lifetime_s``; a connection's session ends when its token expires, so a client
    must authenticate again with a fresh one."""

    directory: Path
    acls_for: Settings | None = None
    plaintext_port: int | None = None
    mode: str = SASL_SSL
    oauth: bool = False
    token_lifetime_s: float = DEFAULT_TOKEN_LIFETIME_S

    def __post_init__(self) -> None:
        assert self.mode in (SASL_SSL, MUTUAL_TLS) and not (self.oauth and self.mode != SASL_SSL), self

    @property
    def listener(self) -> str:
        return self.mode.upper()

    @property
    def token_endpoint(self) -> TokenEndpoint:
        return TokenEndpoint(self.directory, self.token_lifetime_s)

    @property
    def acls(self) -> bool:
        return self.acls_for is not None

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def keystore_file(self) -> Path:
        """The broker's private key (PKCS#8) and certificate chain, the PEM store Kafka reads."""
        return self.directory / "broker-keystore.pem"

    def password_file(self, user: str) -> Path:
        return self.directory / f"{user}.password"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text().strip()

    def cert_file(self, user: str) -> Path:
        return self.directory / f"{user}-cert.pem"

    def key_file(self, user: str) -> Path:
        """The user's client key (PKCS#8), encrypted with the user's password."""
        return self.directory / f"{user}-key.pem"

    def generated(self) -> bool:
        return all(path.exists() for path in (self.ca_file, self.keystore_file,
                                                *map(self.password_file, USERS)))

    def ensure(self) -> None:
        """Generate what is missing; what exists is kept (the users live in the formatted log)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for user in USERS:
            if not self.password_file(user).exists():
                write_private(self.password_file(user), secrets.token_urlsafe(24).encode() + b"\n")
        certificates = (self.ca_file, self.keystore_file, *map(self.cert_file, USERS), *map(self.key_file, USERS))
        if not all(path.exists() for path in certificates):
            made = make_certificates(BROKER_HOST, {user: self.password(user) for user in USERS})
            write_private(self.keystore_file, made.keystore_pem)
            self.ca_file.write_bytes(made.ca_pem)
            for user, (cert_pem, key_pem) in made.clients.items():
                write_private(self.key_file(user), key_pem)
                self.cert_file(user).write_bytes(cert_pem)
        if self.oauth:
            self.token_endpoint.ensure(USERS)

    def scram_arguments(self) -> list[str]:
        """The storage tool's options that create every user at format time."""
        return [argument for user in USERS
                for argument in ("--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={self.password(user)}]")]

    def broker_properties(self, port: int, controller_port: int) -> dict[str, object]:
        """The listener, TLS, SASL and (with ACLs) authorizer entries of ``server.properties``;
        they hold the admin password, so that file is written readable by its owner only."""
        plain = f",PLAINTEXT://127.0.0.1:{self.plaintext_port}" if self.plaintext_port else ""
        listener = self.listener
        properties: dict[str, object] = {
            "listeners": f"{listener}://127.0.0.1:{port}{plain},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"{listener}://{BROKER_HOST}:{port}{plain}",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"{listener}:{listener}{',PLAINTEXT:PLAINTEXT' if plain else ''},"
                                              "CONTROLLER:PLAINTEXT",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": self.keystore_file,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": self.ca_file,
            **(self._sasl_properties() if self.mode == SASL_SSL else
               {"ssl.client.auth": "required", "ssl.principal.mapping.rules": PRINCIPAL_FROM_CN}),
        }
        if self.acls:
            properties["authorizer.class.name"] = AUTHORIZER
            # ANONYMOUS: the controller listener; BROKER_HOST: the broker's certificate, between brokers.
            broker = f";User:{BROKER_HOST}" if self.mode == MUTUAL_TLS else ""
            properties["super.users"] = f"User:{ADMIN};User:ANONYMOUS{broker}"
        return properties

    def _sasl_properties(self) -> dict[str, object]:
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required '
                f'username="{ADMIN}" password="{self.password(ADMIN)}";')
        # PLAIN's users are listed where it is configured, with the same passwords.
        plain_users = " ".join(f'user_{user}="{self.password(user)}"' for user in USERS)
        properties: dict[str, object] = {
            "sasl.enabled.mechanisms": f"{SCRAM_MECHANISM},PLAIN",
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": jaas,
            "listener.name.sasl_ssl.plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
        }
        if self.oauth:
            endpoint = self.token_endpoint
            prefix = "listener.name.sasl_ssl.oauthbearer."
            properties.update({
                "sasl.enabled.mechanisms": f"{SCRAM_MECHANISM},PLAIN,OAUTHBEARER",
                f"{prefix}sasl.jaas.config": f"{OAUTH_PACKAGE}.OAuthBearerLoginModule required;",
                f"{prefix}sasl.server.callback.handler.class": f"{OAUTH_PACKAGE}.OAuthBearerValidatorCallbackHandler",
                # The session of a connection ends with its token: past it, the broker closes the
                # connection unless the client authenticated again.
                f"{prefix}connections.max.reauth.ms": milliseconds(self.token_lifetime_s),
                "sasl.oauthbearer.jwks.endpoint.url": endpoint.jwks_url,
                "sasl.oauthbearer.expected.audience": AUDIENCE,
                "sasl.oauthbearer.expected.issuer": endpoint.issuer,
            })
        return properties

    def jvm_options(self) -> list[str]:
        """The broker JVM's system properties: Kafka 4 fetches keys from allowed URLs only."""
        if not self.oauth:
            return []
        return [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={self.token_endpoint.jwks_url}"]

    def client_env(self, bootstrap: str, user: str) -> dict[str, str]:
        """The ``STREAMAPP_*`` settings of a client connecting to ``bootstrap`` as ``user``."""
        return {"STREAMAPP_BROKER": f"kafka://{bootstrap}", **self.security_env(user)}

    def security_env(self, user: str) -> dict[str, str]:
        tls = {"STREAMAPP_SECURITY_PROTOCOL": self.listener, "STREAMAPP_SSL_CA_FILE": str(self.ca_file)}
        if self.mode == MUTUAL_TLS:
            return {**tls, "STREAMAPP_SSL_CERT_FILE": str(self.cert_file(user)),
                    "STREAMAPP_SSL_KEY_FILE": str(self.key_file(user)),
                    "STREAMAPP_SSL_KEY_PASSWORD_FILE": str(self.password_file(user))}
        if self.oauth:
            endpoint = self.token_endpoint
            return {**tls, "STREAMAPP_SASL_MECHANISM": "OAUTHBEARER", "STREAMAPP_OAUTH_TOKEN_URL": endpoint.token_url,
                    "STREAMAPP_OAUTH_CLIENT_ID": user,
                    "STREAMAPP_OAUTH_CLIENT_SECRET_FILE": str(endpoint.client_secret_file(user)),
                    "STREAMAPP_OAUTH_SCOPE": SCOPE}
        return {**tls, "STREAMAPP_SASL_MECHANISM": SCRAM_MECHANISM, "STREAMAPP_SASL_USERNAME": user,
                "STREAMAPP_SASL_PASSWORD_FILE": str(self.password_file(user))}

    def client_options(self, user: str) -> dict[str, Any]:
        """aiokafka client options for ``user``, made as every client's are (the broker
        manager's own checks run as admin)."""
        return security_options(KafkaSecurity.from_env(self.security_env(user)))


def export_lines(env: dict[str, str]) -> str:
    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in env.items())


@dataclasses.dataclass(frozen=True)
class Certificates:
    """``ca_pem``; ``keystore_pem``: the server's PKCS#8 key, its certificate and the CA's;
    ``clients``: per user, a client certificate (its subject ``CN=<user>``) and its PKCS#8 key
    encrypted with the password given for that user."""

    ca_pem: bytes
    keystore_pem: bytes
    clients: dict[str, tuple[bytes, bytes]]


def make_certificates(hostname: str, clients: dict[str, str] | None = None,
                      now: datetime.datetime | None = None) -> Certificates:
    """A new CA, a server certificate it signed for ``hostname`` (its only name), and a client
    certificate for each user of ``clients`` (user -> the password of its key)."""
    now = now or datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=CERTIFICATE_DAYS))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamapp local broker CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid[0]).not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def signed(common_name: str, names: list[x509.GeneralName],
               usages: list[x509.ObjectIdentifier]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(valid[0]).not_valid_after(valid[1])
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    def pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    def pkcs8(key: ec.EllipticCurvePrivateKey, password: str | None) -> bytes:
        encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                      else serialization.NoEncryption())
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)

    # The broker's certificate also serves as a client's, between brokers.
    key, cert = signed(hostname, [x509.DNSName(hostname)],
                       [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    made = {user: signed(user, [], [ExtendedKeyUsageOID.CLIENT_AUTH]) for user in (clients or {})}
    return Certificates(pem(ca_cert), pkcs8(key, None) + pem(cert) + pem(ca_cert),
                        {user: (pem(client_cert), pkcs8(client_key, (clients or {})[user]))
                         for user, (client_key, client_cert) in made.items()})
