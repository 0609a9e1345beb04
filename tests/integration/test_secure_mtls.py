"""Mutual TLS against the broker started with ``--security ssl --acls`` (the ``mtls_kafka``
fixture): the listener requires a client certificate signed by its CA, and the certificate's
common name is the principal its ACLs name (``User:pipeline``)."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization

from streamapp.errors import ExitCode
from streamapp.tools.localkafka.security import ADMIN, PIPELINE, make_certificates

from secured import assert_one_line, resize_worker, run_cli, run_worker, scaled_frames, user_env


def test_a_client_certificate_carries_the_cli_and_a_worker(mtls_kafka, tmp_path):
    made = run_cli(user_env(mtls_kafka, ADMIN), "topics", "create")
    assert made.returncode == 0, made.stderr
    # The pipeline's own key is encrypted (STREAMAPP_SSL_KEY_PASSWORD_FILE); the same key in clear works too.
    encrypted = user_env(mtls_kafka, PIPELINE)
    key = serialization.load_pem_private_key(mtls_kafka.security.key_file(PIPELINE).read_bytes(),
                                             mtls_kafka.security.password(PIPELINE).encode())
    clear_key = tmp_path / "pipeline-key.pem"
    clear_key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    clear = {**encrypted, "STREAMAPP_SSL_KEY_FILE": str(clear_key), "STREAMAPP_SSL_KEY_PASSWORD_FILE": ""}
    with resize_worker(encrypted, tmp_path):
        for env in (encrypted, clear):
            produced = run_cli(env, "produce", "--synthetic", "--frames", "3")
            assert produced.returncode == 0, produced.stderr
        # ACLs are on: the pipeline's principal is its certificate's common name, or nothing is written.
        assert scaled_frames(mtls_kafka, 6) == 6


def test_without_a_client_certificate_the_broker_refuses_in_one_line(mtls_kafka, tmp_path):
    env = user_env(mtls_kafka, PIPELINE, STREAMAPP_SSL_CERT_FILE="", STREAMAPP_SSL_KEY_FILE="",
                   STREAMAPP_SSL_KEY_PASSWORD_FILE="")
    for proc in (run_cli(env, "produce", "--synthetic", "--frames", "2"), run_worker(env, tmp_path, "resize")):
        assert_one_line(proc, ExitCode.CLIENT_CERTIFICATE_REFUSED,
                        f"the broker {mtls_kafka.bootstrap} requires a client certificate and none was sent",
                        "set STREAMAPP_SSL_CERT_FILE and STREAMAPP_SSL_KEY_FILE")


def test_a_certificate_of_another_ca_is_refused_in_one_line(mtls_kafka, tmp_path):
    cert_pem, key_pem = make_certificates("localhost", {PIPELINE: ""}).clients[PIPELINE]
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    (tmp_path / "key.pem").write_bytes(key_pem)
    env = user_env(mtls_kafka, PIPELINE, STREAMAPP_SSL_CERT_FILE=str(tmp_path / "cert.pem"),
                   STREAMAPP_SSL_KEY_FILE=str(tmp_path / "key.pem"), STREAMAPP_SSL_KEY_PASSWORD_FILE="")
    assert_one_line(run_cli(env, "produce", "--synthetic", "--frames", "2"), ExitCode.CLIENT_CERTIFICATE_REFUSED,
                    f"refused the client certificate STREAMAPP_SSL_CERT_FILE={tmp_path / 'cert.pem'}")
