"""A local broker secured as a production Kafka is: ``broker start --security sasl_ssl``.

Clients meet one SASL_SSL listener (SCRAM-SHA-512 over TLS), advertised as ``localhost:PORT``.
At the first start a throwaway CA, a broker certificate naming ``localhost`` only, and a random
password per user (``admin``, ``pipeline``) are generated into ``<data dir>/security``; the users
are written into the metadata log when the storage is formatted, so they belong to that data dir.
Brokers talk to each other on the same listener as ``admin``. The controller listener stays
PLAINTEXT on 127.0.0.1: with ACLs on, its principal (``User:ANONYMOUS``) is a super user, so anyone
on this machine who can reach the controller port is too -- a local broker, not a production one.
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

SECURITY_MODES = ("plaintext", "sasl_ssl")
SCRAM_MECHANISM = "SCRAM-SHA-512"
ADMIN, PIPELINE = "admin", "pipeline"
USERS = (ADMIN, PIPELINE)
# The only name in the broker certificate: a client that connects to 127.0.0.1 fails the hostname check.
BROKER_HOST = "localhost"
CERTIFICATE_DAYS = 365
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclasses.dataclass(frozen=True)
class BrokerSecurity:
    """The TLS material and SCRAM passwords of a secured broker (or cluster) in ``directory``.
    ``acls_for``: the StandardAuthorizer on, ``admin`` the only super user besides the
    controllers, and the ``pipeline`` user granted what these settings' pipeline needs.
    ``plaintext_port``: a PLAINTEXT listener on 127.0.0.1 beside it, for local tools whose own
    TLS would share the machine with what they measure (the join benchmark's load and reader)."""

    directory: Path
    acls_for: Settings | None = None
    plaintext_port: int | None = None

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

    def generated(self) -> bool:
        return all(path.exists() for path in (self.ca_file, self.keystore_file,
                                                *map(self.password_file, USERS)))

    def ensure(self) -> None:
        """Generate what is missing; what exists is kept (the users live in the formatted log)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        if not (self.ca_file.exists() and self.keystore_file.exists()):
            ca_pem, keystore_pem = make_certificates(BROKER_HOST)
            write_private(self.keystore_file, keystore_pem)
            self.ca_file.write_bytes(ca_pem)
        for user in USERS:
            if not self.password_file(user).exists():
                write_private(self.password_file(user), secrets.token_urlsafe(24).encode() + b"\n")

    def scram_arguments(self) -> list[str]:
        """The storage tool's options that create every user at format time."""
        return [argument for user in USERS
                for argument in ("--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={self.password(user)}]")]

    def broker_properties(self, port: int, controller_port: int) -> dict[str, object]:
        """The listener, TLS, SASL and (with ACLs) authorizer entries of ``server.properties``;
        they hold the admin password, so that file is written readable by its owner only."""
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required '
                f'username="{ADMIN}" password="{self.password(ADMIN)}";')
        plain = f",PLAINTEXT://127.0.0.1:{self.plaintext_port}" if self.plaintext_port else ""
        properties: dict[str, object] = {
            "listeners": f"SASL_SSL://127.0.0.1:{port}{plain},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"SASL_SSL://{BROKER_HOST}:{port}{plain}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": f"SASL_SSL:SASL_SSL{',PLAINTEXT:PLAINTEXT' if plain else ''},"
                                              "CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": self.keystore_file,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": self.ca_file,
        }
        if self.acls:
            properties["authorizer.class.name"] = AUTHORIZER
            properties["super.users"] = f"User:{ADMIN};User:ANONYMOUS"  # ANONYMOUS: the controller listener
        return properties

    def client_env(self, bootstrap: str, user: str) -> dict[str, str]:
        """The ``STREAMAPP_*`` settings of a client connecting to ``bootstrap`` as ``user``."""
        return {"STREAMAPP_BROKER": f"kafka://{bootstrap}", **self.security_env(user)}

    def security_env(self, user: str) -> dict[str, str]:
        return {
            "STREAMAPP_SECURITY_PROTOCOL": "SASL_SSL",
            "STREAMAPP_SSL_CA_FILE": str(self.ca_file),
            "STREAMAPP_SASL_MECHANISM": SCRAM_MECHANISM,
            "STREAMAPP_SASL_USERNAME": user,
            "STREAMAPP_SASL_PASSWORD_FILE": str(self.password_file(user)),
        }

    def client_options(self, user: str) -> dict[str, Any]:
        """aiokafka client options for ``user``, made as every client's are (the broker
        manager's own checks run as admin)."""
        return security_options(KafkaSecurity.from_env(self.security_env(user)))


def export_lines(env: dict[str, str]) -> str:
    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in env.items())


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file only its owner can read (created so, never widened)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


def make_certificates(hostname: str, now: datetime.datetime | None = None) -> tuple[bytes, bytes]:
    """A new CA and a server certificate it signed for ``hostname`` (its only name): the CA's
    PEM, and the server's PKCS#8 key followed by its certificate and the CA's."""
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
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid[0]).not_valid_after(valid[1])
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return ca_pem, key_pem + cert.public_bytes(serialization.Encoding.PEM) + ca_pem
