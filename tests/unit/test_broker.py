"""The broker manager's failure paths that need no running broker (and no Java)."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from streamapp.cli.main import main
from streamapp.errors import ExitCode
from streamapp.settings import STAGES, Settings
from streamapp.tools.localkafka import jars, locations, processes
from streamapp.tools.localkafka.acls import PatternType, pipeline_acls
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.localkafka.cluster import LocalCluster
from streamapp.tools.localkafka.common import BrokerError
from streamapp.tools.localkafka.jars import check_java, ensure_jars, find_java, parse_java_version
from streamapp.tools.localkafka.processes import free_port, last_error_line, new_cluster_id, port_in_use
from streamapp.tools.localkafka.security import (
    ADMIN,
    MUTUAL_TLS,
    PIPELINE,
    USERS,
    BrokerSecurity,
    export_lines,
    make_certificates,
)
from streamapp.topics import changelog_name, topic_names

MIB = 1024**2


@pytest.fixture
def notes():
    return []


@pytest.fixture
def local(tmp_path, notes):
    return LocalBroker(tmp_path / "broker", free_port(), notify=notes.append)


def fake_java(directory: Path, version_output: str) -> Path:
    """A ``java`` that prints ``version_output`` for ``-version`` (as Java does, on stderr)."""
    directory.mkdir(parents=True, exist_ok=True)
    java = directory / "java"
    lines = "".join(f"printf '%s\\n' '{line}' >&2\n" for line in version_output.splitlines())
    java.write_text(f"#!/bin/sh\n{lines}")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return java


# --- Java ----------------------------------------------------------------------------------


@pytest.mark.parametrize("output, major", [
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
    ('openjdk version "21" 2023-09-19', 21),
    ('openjdk version "17-ea" 2021-09-14', 17),
    ('java version "1.8.0_292"\nJava(TM) SE Runtime Environment', 8),
    ('openjdk version "11.0.2" 2019-01-15', 11),
    ('Picked up JAVA_TOOL_OPTIONS: -Xss2m\nopenjdk version "25.0.1+8-LTS" 2025-10-21', 25),
])
def test_parse_java_version(output, major):
    assert parse_java_version(output) == major


@pytest.mark.parametrize("output", ["", "command not found", 'openjdk version "x.y"'])
def test_unreadable_java_version_is_a_clear_error(output):
    with pytest.raises(BrokerError, match="Java version"):
        parse_java_version(output)


def test_old_java_is_refused_saying_17_is_needed(tmp_path):
    java = fake_java(tmp_path, 'java version "1.8.0_292"')
    with pytest.raises(BrokerError, match=r"Java 8.*needs Java 17\+"):
        check_java(str(java))


def test_java_17_is_accepted(tmp_path):
    java = fake_java(tmp_path, 'openjdk version "17.0.15" 2025-04-15')
    assert check_java(str(java)) == str(java)


def test_no_java_at_all(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokerError, match=r"Java not found.*Java 17\+"):
        find_java()


def test_java_home_is_preferred(tmp_path, monkeypatch):
    java = fake_java(tmp_path / "jdk" / "bin", 'openjdk version "21"')
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert find_java() == str(java)


def test_start_with_old_java_fails_before_fetching_anything(local, tmp_path, monkeypatch):
    fake_java(tmp_path / "jdk" / "bin", 'openjdk version "11.0.2" 2019-01-15')
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("PATH", str(tmp_path / "jdk" / "bin"))
    with pytest.raises(BrokerError, match=r"Java 11.*17\+"):
        LocalBroker(local.data_dir, local.port, kafka_home=tmp_path / "home").start()
    assert not (tmp_path / "home").exists()


# --- jars ----------------------------------------------------------------------------------


def pom_digest() -> str:
    return hashlib.sha256(jars.packaged("pom.xml")).hexdigest()[:16]


def test_no_maven_and_no_cached_jars(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BrokerError) as info:
        ensure_jars(tmp_path / "home")
    message = str(info.value)
    assert "Maven" in message and "mvn" in message and "STREAMAPP_KAFKA_HOME" in message
    assert str(tmp_path / "home" / "libs") in message


def test_cached_jars_are_reused_without_maven(tmp_path, monkeypatch):
    libs = tmp_path / "home" / "libs"
    libs.mkdir(parents=True)
    (libs / ".complete").write_text(pom_digest() + "\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert ensure_jars(tmp_path / "home") == libs


def test_an_incomplete_or_outdated_copy_is_not_used(tmp_path, monkeypatch):
    libs = tmp_path / "home" / "libs"
    libs.mkdir(parents=True)
    (libs / "kafka_2.13-4.1.1.jar").write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BrokerError, match="Maven"):
        ensure_jars(tmp_path / "home")  # no marker: an interrupted copy
    (libs / ".complete").write_text("0123456789abcdef\n")
    with pytest.raises(BrokerError, match="Maven"):
        ensure_jars(tmp_path / "home")  # marker of another pom


def test_kafka_home_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMAPP_KAFKA_HOME", str(tmp_path / "k"))
    assert locations.kafka_home() == tmp_path / "k"
    monkeypatch.delenv("STREAMAPP_KAFKA_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert locations.kafka_home() == tmp_path / "cache" / "streamapp" / "kafka-4.1.1"


# --- pid file ------------------------------------------------------------------------------


def finished_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_pid_file_is_removed_and_reported(local, notes):
    local.data_dir.mkdir(parents=True)
    pid = finished_pid()
    local.pid_file.write_text(f"{pid}\n")
    status = local.status()
    assert not status.running and status.pid is None
    assert not local.pid_file.exists()
    assert any("stale pid file" in note and str(pid) in note for note in notes)


def test_stop_with_a_stale_pid_file_reports_not_running(local, notes):
    local.data_dir.mkdir(parents=True)
    local.pid_file.write_text(f"{finished_pid()}\n")
    assert local.stop() == "not running"
    assert not local.pid_file.exists()
    assert notes


def test_a_pid_reused_by_another_process_is_never_signalled(local, notes):
    local.data_dir.mkdir(parents=True)
    local.pid_file.write_text(f"{os.getpid()}\n")  # alive, but not a Kafka broker: this test run
    assert local.stop(timeout=1) == "not running"
    assert not local.pid_file.exists()
    assert any("another process" in note for note in notes)


def test_garbage_pid_file(local, notes):
    local.data_dir.mkdir(parents=True)
    local.pid_file.write_text("not a pid")
    assert not local.status().running
    assert not local.pid_file.exists()


def test_status_of_a_data_dir_that_never_ran(local):
    status = local.status()
    assert not status.running
    assert status.port == local.port
    assert "not running" in status.describe()


# --- data dir of another cluster -----------------------------------------------------------


def test_data_dir_formatted_for_another_cluster_is_refused(local):
    (local.data_dir / "logs").mkdir(parents=True)
    local.cluster_id_file.write_text("AAAAAAAAAAAAAAAAAAAAAA\n")
    (local.data_dir / "logs" / "meta.properties").write_text(
        "version=1\nnode.id=1\ncluster.id=BBBBBBBBBBBBBBBBBBBBBB\ndirectory.id=x\n")
    with pytest.raises(BrokerError) as info:
        local.start(timeout=5)
    message = str(info.value)
    assert "AAAAAAAAAAAAAAAAAAAAAA" in message and "BBBBBBBBBBBBBBBBBBBBBB" in message
    assert "--data-dir" in message and "delete" in message
    assert not local.pid_file.exists()


def test_data_dir_formatted_for_another_node_is_refused(local):
    (local.data_dir / "logs").mkdir(parents=True)
    (local.data_dir / "logs" / "meta.properties").write_text("version=1\nnode.id=3\ncluster.id=C\n")
    with pytest.raises(BrokerError, match="node 3"):
        local.start(timeout=5)


def test_new_cluster_ids_look_like_kafkas():
    for _ in range(200):
        cluster_id = new_cluster_id()
        assert len(cluster_id) == 22 and not cluster_id.startswith("-")
        assert set(cluster_id) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


# --- ports ---------------------------------------------------------------------------------


def test_port_in_use_is_refused_before_anything_starts(tmp_path, notes):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_in_use(port)
        broker = LocalBroker(tmp_path / "b", port, notify=notes.append)
        with pytest.raises(BrokerError, match=rf"port {port} .*already in use.*--port"):
            broker.start(timeout=5)
    assert not port_in_use(port)
    assert not broker.pid_file.exists()


def test_bound_but_not_listening_port_counts_as_in_use():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert port_in_use(sock.getsockname()[1])


def test_invalid_port():
    with pytest.raises(BrokerError, match="not a TCP port"):
        LocalBroker("/nonexistent", 70000)


# --- configuration -------------------------------------------------------------------------


def test_server_properties_carry_large_frames_and_no_auto_creation(local):
    props = local.properties(controller_port=local.port + 1)
    assert props["message.max.bytes"] >= 16 * MIB
    assert props["replica.fetch.max.bytes"] >= 16 * MIB
    assert props["fetch.max.bytes"] >= 16 * MIB
    assert props["auto.create.topics.enable"] == "false"
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{local.port + 1}"
    assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{local.port}"
    assert props["log.dirs"] == local.data_dir / "logs"
    assert props["log.retention.check.interval.ms"] <= 30_000
    assert props["log.cleaner.enable"] == "true"


def test_a_single_broker_keeps_one_copy_of_everything(local):
    props = local.properties(controller_port=local.port + 1)
    assert props["node.id"] == 1
    assert props["default.replication.factor"] == props["offsets.topic.replication.factor"] == 1
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == 1


def test_cluster_nodes_share_one_quorum_and_keep_three_copies(tmp_path):
    cluster = LocalCluster(tmp_path / "cluster", 19092)
    voters = "1@127.0.0.1:19095,2@127.0.0.1:19096,3@127.0.0.1:19097"
    assert cluster.bootstrap == "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
    assert cluster.replication == 3
    for number, node in enumerate(cluster.nodes, start=1):
        props = node.properties(controller_port=19094 + number)
        assert props["node.id"] == number and props["controller.quorum.voters"] == voters
        assert props["listeners"] == (f"PLAINTEXT://127.0.0.1:{19091 + number},"
                                      f"CONTROLLER://127.0.0.1:{19094 + number}")
        assert props["default.replication.factor"] == props["offsets.topic.replication.factor"] == 3
        assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == 2
        assert node.data_dir == (tmp_path / "cluster" / f"node-{number}").resolve()


def test_cluster_nodes_are_formatted_with_one_cluster_id(tmp_path):
    cluster = LocalCluster(tmp_path / "cluster", 19092)
    cluster._share_cluster_id()
    ids = {node.cluster_id_file.read_text() for node in cluster.nodes}
    assert ids == {cluster.cluster_id_file.read_text()} and len(ids) == 1


def test_a_cluster_does_not_fit_above_the_last_port(tmp_path):
    with pytest.raises(BrokerError, match="needs ports 65533-65538"):
        LocalCluster(tmp_path, 65533)


def test_a_cluster_in_the_ephemeral_port_range_is_refused(tmp_path):
    ephemeral = processes.ephemeral_ports()
    with pytest.raises(BrokerError, match="overlap the ephemeral range"):
        LocalCluster(tmp_path, ephemeral.start - 2)


def test_a_free_port_block_is_free_and_below_the_ephemeral_range():
    first = processes.free_port_block(6)
    assert first + 6 <= processes.ephemeral_ports().start
    assert not any(port_in_use(port) for port in range(first, first + 6))


def test_a_node_formatted_for_another_node_id_is_refused(tmp_path):
    node = LocalCluster(tmp_path / "cluster", 19092).nodes[1]
    node.log_dirs.mkdir(parents=True)
    (node.log_dirs / "meta.properties").write_text("cluster.id=abc\nnode.id=1\n")
    with pytest.raises(BrokerError, match="formatted for Kafka node 1, not node 2"):
        node.start()


def test_extra_properties_override(tmp_path):
    broker = LocalBroker(tmp_path, 19999, max_message_bytes=32 * MIB,
                         extra_properties={"log.retention.check.interval.ms": 1000, "num.partitions": 3})
    props = broker.properties(20000)
    assert props["message.max.bytes"] == 32 * MIB
    assert props["log.retention.check.interval.ms"] == 1000 and props["num.partitions"] == 3


def test_packaged_broker_files_are_installed():
    assert b"<artifactId>kafka_2.13</artifactId>" in jars.packaged("pom.xml")
    assert b"Configuration:" in jars.packaged("log4j2.yaml")


def test_the_last_error_line_of_a_broker_log_says_why_it_stopped(tmp_path):
    log = tmp_path / "broker.log"
    log.write_text("[2026-12-01 10:00:00,000] INFO starting (kafka.server.KafkaRaftServer)\n"
                   "[2026-12-01 10:00:01,000] ERROR Exiting Kafka due to fatal exception (kafka.Kafka)\n"
                   "org.apache.kafka.common.config.ConfigException: Invalid value 1 for configuration "
                   "log.segment.bytes: Value must be at least 1048576\n"
                   "\tat org.apache.kafka.common.config.ConfigDef.parseValue(ConfigDef.java:1)\n")
    assert last_error_line(log).startswith("org.apache.kafka.common.config.ConfigException: Invalid value 1")
    log.write_text("[2026-12-01 10:00:00,000] INFO all well\n")
    assert last_error_line(log) is None
    assert last_error_line(tmp_path / "missing.log") is None


# --- --security sasl_ssl -------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates():
    return make_certificates("localhost", {PIPELINE: "key-password"})


def test_the_ca_signs_a_broker_certificate_for_localhost_only(certificates):
    ca_pem, keystore_pem = certificates.ca_pem, certificates.keystore_pem
    ca = x509.load_pem_x509_certificate(ca_pem)
    [leaf, chained_ca] = x509.load_pem_x509_certificates(keystore_pem)
    assert chained_ca == ca
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf.verify_directly_issued_by(ca)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [name.value for name in names] == ["localhost"]  # no IP: 127.0.0.1 fails the hostname check
    now = datetime.datetime.now(datetime.UTC)
    assert leaf.not_valid_before_utc < now < leaf.not_valid_after_utc


def test_the_keystore_is_a_pem_store_kafka_reads(certificates):
    """Kafka's PEM key store: an unencrypted PKCS#8 key, then the chain; Python's TLS accepts
    it as a server's chain and trusts it through the CA file."""
    keystore_pem = certificates.keystore_pem
    assert keystore_pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert keystore_pem.count(b"-----BEGIN CERTIFICATE-----") == 2
    key = serialization.load_pem_private_key(keystore_pem, password=None)
    [leaf, _] = x509.load_pem_x509_certificates(keystore_pem)
    assert key.public_key() == leaf.public_key()


def test_the_ca_signs_each_users_client_certificate_its_key_encrypted(certificates):
    cert_pem, key_pem = certificates.clients[PIPELINE]
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(certificates.ca_pem))
    assert cert.subject.rfc4514_string() == "CN=pipeline"  # the principal User:pipeline (PRINCIPAL_FROM_CN)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
    assert key_pem.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----\n")
    with pytest.raises(TypeError):
        serialization.load_pem_private_key(key_pem, password=None)
    assert serialization.load_pem_private_key(key_pem, b"key-password").public_key() == cert.public_key()


def test_security_files_are_made_once_readable_by_their_owner_only(tmp_path):
    security = BrokerSecurity(tmp_path / "security")
    assert not security.generated()
    security.ensure()
    assert security.generated()
    assert stat.S_IMODE(security.directory.stat().st_mode) == 0o700
    for secret in (security.keystore_file, *map(security.password_file, USERS), *map(security.key_file, USERS)):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    passwords = {user: security.password(user) for user in USERS}
    assert len(set(passwords.values())) == len(USERS) and all(len(p) >= 32 for p in passwords.values())
    ca = security.ca_file.read_bytes()
    security.ensure()  # a restart keeps them: the users were created with these passwords
    assert {user: security.password(user) for user in USERS} == passwords
    assert security.ca_file.read_bytes() == ca


def test_users_are_created_at_format_time_with_scram_sha_512(tmp_path):
    security = BrokerSecurity(tmp_path / "security")
    security.ensure()
    assert security.scram_arguments() == [
        "--add-scram", f"SCRAM-SHA-512=[name=admin,password={security.password(ADMIN)}]",
        "--add-scram", f"SCRAM-SHA-512=[name=pipeline,password={security.password(PIPELINE)}]",
    ]


def test_the_scram_passwords_never_reach_the_storage_tools_command_line(tmp_path):
    broker = secured(tmp_path)
    # A java that keeps its command line and the argument file it names.
    java = tmp_path / "java"
    java.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$0.argv"\n'
                    'for a; do last=$a; done\ncat "${last#@}" > "$0.file"\n')
    java.chmod(0o700)
    broker._format(str(java), tmp_path / "libs", "cluster-id")
    argv, argument_file = (tmp_path / "java.argv").read_text(), (tmp_path / "java.file").read_text()
    assert all(broker.security.password(user) not in argv for user in USERS)
    assert f'"SCRAM-SHA-512=[name=pipeline,password={broker.security.password(PIPELINE)}]"' in argument_file
    assert argv.splitlines()[-1] == f"@{tmp_path / 'format.args'}" and not (tmp_path / "format.args").exists()


def secured(tmp_path, port=19092, acls_for=None) -> LocalBroker:
    security = BrokerSecurity(tmp_path / "security", acls_for)
    security.ensure()
    return LocalBroker(tmp_path, port, security=security)


def test_a_secured_broker_takes_sasl_ssl_clients_only_advertised_as_localhost(tmp_path):
    broker = secured(tmp_path)
    props = broker.properties(controller_port=19093)
    assert broker.bootstrap == "localhost:19092"
    assert props["listeners"] == "SASL_SSL://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "SASL_SSL://localhost:19092"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,PLAIN"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    jaas = props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    assert f'username="admin" password="{broker.security.password(ADMIN)}";' in jaas
    plain = props["listener.name.sasl_ssl.plain.sasl.jaas.config"]
    assert f'user_pipeline="{broker.security.password(PIPELINE)}";' in plain
    assert props["ssl.keystore.type"] == props["ssl.truststore.type"] == "PEM"
    assert props["ssl.keystore.location"] == broker.security.keystore_file
    assert "authorizer.class.name" not in props


def test_a_plaintext_port_adds_a_plaintext_listener_beside_the_secured_one(tmp_path):
    security = BrokerSecurity(tmp_path / "security", plaintext_port=19094)
    security.ensure()
    broker = LocalBroker(tmp_path, 19092, security=security)
    props = broker.properties(controller_port=19093)
    assert props["listeners"] == ("SASL_SSL://127.0.0.1:19092,PLAINTEXT://127.0.0.1:19094,"
                                  "CONTROLLER://127.0.0.1:19093")
    assert props["advertised.listeners"] == "SASL_SSL://localhost:19092,PLAINTEXT://127.0.0.1:19094"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert broker.bootstrap == "localhost:19092"
    broker._write_properties(19093)
    assert broker.status().protocol == "SASL_SSL"  # what `broker status` names: the secured listener


def test_with_acls_admin_is_the_super_user_besides_the_controller_listener(tmp_path):
    props = secured(tmp_path, acls_for=Settings()).properties(controller_port=19093)
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["super.users"] == "User:admin;User:ANONYMOUS"


def test_the_properties_file_of_a_secured_broker_is_private(tmp_path):
    broker = secured(tmp_path)
    broker._write_properties(19093)
    assert stat.S_IMODE(broker.properties_file.stat().st_mode) == 0o600
    assert broker.status().bootstrap == "localhost:19092"
    assert "SASL_SSL localhost:19092" in dataclasses.replace(broker.status(), running=True).describe()


def test_a_data_dir_formatted_without_users_cannot_run_secured(local):
    local.log_dirs.mkdir(parents=True)
    (local.log_dirs / "meta.properties").write_text("cluster.id=abc\nnode.id=1\n")
    local.security = BrokerSecurity(local.data_dir / "security")
    with pytest.raises(BrokerError, match="formatted without SASL users"):
        local.start()


def test_client_settings_use_the_agreed_names(tmp_path):
    security = BrokerSecurity(tmp_path / "a dir")
    env = security.client_env("localhost:19092", PIPELINE)
    assert env == {
        "STREAMAPP_BROKER": "kafka://localhost:19092",
        "STREAMAPP_SECURITY_PROTOCOL": "SASL_SSL",
        "STREAMAPP_SSL_CA_FILE": str(tmp_path / "a dir" / "ca.pem"),
        "STREAMAPP_SASL_MECHANISM": "SCRAM-SHA-512",
        "STREAMAPP_SASL_USERNAME": "pipeline",
        "STREAMAPP_SASL_PASSWORD_FILE": str(tmp_path / "a dir" / "pipeline.password"),
    }
    assert f"export STREAMAPP_SSL_CA_FILE='{tmp_path}/a dir/ca.pem'" in export_lines(env).splitlines()


def test_mutual_tls_requires_a_client_certificate_its_common_name_the_principal(tmp_path):
    security = BrokerSecurity(tmp_path / "security", Settings(), mode=MUTUAL_TLS)
    security.ensure()
    props = LocalBroker(tmp_path, 19092, security=security).properties(controller_port=19093)
    assert props["listeners"] == "SSL://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "SSL://localhost:19092"
    assert props["inter.broker.listener.name"] == "SSL"
    assert props["ssl.client.auth"] == "required"
    assert props["ssl.principal.mapping.rules"] == "RULE:^CN=([^,]+)$/$1/,DEFAULT"
    assert props["super.users"] == "User:admin;User:ANONYMOUS;User:localhost"  # localhost: between brokers
    assert not any(key.startswith("sasl.") or ".sasl." in key for key in props)
    assert security.client_env("localhost:19092", PIPELINE) == {
        "STREAMAPP_BROKER": "kafka://localhost:19092",
        "STREAMAPP_SECURITY_PROTOCOL": "SSL",
        "STREAMAPP_SSL_CA_FILE": str(security.ca_file),
        "STREAMAPP_SSL_CERT_FILE": str(tmp_path / "security" / "pipeline-cert.pem"),
        "STREAMAPP_SSL_KEY_FILE": str(tmp_path / "security" / "pipeline-key.pem"),
        "STREAMAPP_SSL_KEY_PASSWORD_FILE": str(tmp_path / "security" / "pipeline.password"),
    }


def test_oauth_adds_oauthbearer_checked_by_the_endpoints_keys_issuer_and_audience(tmp_path):
    security = BrokerSecurity(tmp_path / "security", oauth=True, token_lifetime_s=20)
    security.ensure()
    security.token_endpoint.port_file.write_text("18080\n")
    props = LocalBroker(tmp_path, 19092, security=security).properties(controller_port=19093)
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,PLAIN,OAUTHBEARER"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    prefix = "listener.name.sasl_ssl.oauthbearer."
    assert props[f"{prefix}sasl.server.callback.handler.class"] == (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler")
    assert props[f"{prefix}connections.max.reauth.ms"] == 20_000
    assert props["sasl.oauthbearer.jwks.endpoint.url"] == "http://127.0.0.1:18080/oauth2/jwks"
    assert props["sasl.oauthbearer.expected.issuer"] == "http://127.0.0.1:18080"
    assert props["sasl.oauthbearer.expected.audience"] == "kafka"
    assert security.jvm_options() == [
        "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=http://127.0.0.1:18080/oauth2/jwks"]
    env = security.client_env("localhost:19092", PIPELINE)
    assert env == {
        "STREAMAPP_BROKER": "kafka://localhost:19092",
        "STREAMAPP_SECURITY_PROTOCOL": "SASL_SSL",
        "STREAMAPP_SSL_CA_FILE": str(security.ca_file),
        "STREAMAPP_SASL_MECHANISM": "OAUTHBEARER",
        "STREAMAPP_OAUTH_TOKEN_URL": "http://127.0.0.1:18080/oauth2/token",
        "STREAMAPP_OAUTH_CLIENT_ID": "pipeline",
        "STREAMAPP_OAUTH_CLIENT_SECRET_FILE": str(tmp_path / "security" / "pipeline.client-secret"),
        "STREAMAPP_OAUTH_SCOPE": "kafka",
    }
    assert stat.S_IMODE(security.token_endpoint.signing_key_file.stat().st_mode) == 0o600
    assert BrokerSecurity(tmp_path / "security").jvm_options() == []


@pytest.mark.parametrize("argv, phrase", [
    (["--oauth"], "--oauth needs --security sasl_ssl on one node"),
    (["--acls"], "--acls needs --security sasl_ssl or ssl — add one of them"),
    (["--security", "ssl", "--oauth"], "--oauth needs --security sasl_ssl on one node"),
    (["--security", "sasl_ssl", "--oauth", "--nodes", "3"], "--oauth needs --security sasl_ssl on one node"),
])
def test_acls_and_oauth_are_refused_where_they_do_not_apply(tmp_path, argv, phrase, capsys):
    assert main(["broker", "start", "--data-dir", str(tmp_path / "b"), *argv]) == ExitCode.USAGE
    assert phrase in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_a_secured_cluster_shares_one_security_dir_and_adds_the_acls_once(tmp_path):
    security = BrokerSecurity(tmp_path / "cluster" / "security", Settings())
    security.ensure()
    cluster = LocalCluster(tmp_path / "cluster", 19092, security=security)
    assert cluster.bootstrap == "localhost:19092,localhost:19093,localhost:19094"
    for number, node in enumerate(cluster.nodes, start=1):
        props = node.properties(controller_port=19094 + number)
        assert props["advertised.listeners"] == f"SASL_SSL://localhost:{19091 + number}"
        assert props["controller.quorum.voters"] == "1@127.0.0.1:19095,2@127.0.0.1:19096,3@127.0.0.1:19097"
        assert props["ssl.keystore.location"] == security.keystore_file
        assert props["super.users"] == "User:admin;User:ANONYMOUS"


# --- the pipeline user's ACLs ----------------------------------------------------------------


def granted(acls) -> set[tuple[str, str, str, str]]:
    return {(acl.resource.name, acl.name, acl.pattern.name, acl.operation.name) for acl in acls}


def test_the_pipeline_reads_and_writes_its_topics_and_creates_nothing():
    settings = Settings(topic_prefix="cam.", app_id="city")
    assert granted(pipeline_acls(settings)) == {
        ("TOPIC", "cam.frames", "LITERAL", "WRITE"),
        ("TOPIC", "cam.frames", "LITERAL", "READ"),
        ("TOPIC", "cam.frames.scaled", "LITERAL", "WRITE"),
        ("TOPIC", "cam.frames.scaled", "LITERAL", "READ"),
        ("TOPIC", "cam.detections", "LITERAL", "WRITE"),
        ("TOPIC", "cam.detections", "LITERAL", "READ"),
        ("TOPIC", "cam.joined", "LITERAL", "WRITE"),
        ("TOPIC", "cam.joined", "LITERAL", "READ"),
        ("TOPIC", "cam.deadletter", "LITERAL", "WRITE"),
        ("TOPIC", "cam.city-", "PREFIXED", "WRITE"),
        ("TOPIC", "cam.city-", "PREFIXED", "READ"),
        ("GROUP", "cam.city-", "PREFIXED", "READ"),
    }
    exactly_once = pipeline_acls(settings.replace(processing_guarantee="exactly_once"))
    assert granted(exactly_once) - granted(pipeline_acls(settings)) == {
        ("TRANSACTIONAL_ID", "cam.city-", "PREFIXED", "WRITE")}


@pytest.mark.parametrize("stages", [STAGES, ("resize",), ("infer",), ("join",), ("sink",), ("join", "sink")])
def test_the_prefixed_acls_cover_the_names_faust_and_the_workers_use(stages):
    from faust.transport.consumer import TopicPartitionGroup, TransactionManager

    settings = Settings(topic_prefix="cam.", app_id="city", stages=stages, processing_guarantee="exactly_once")
    prefixes = {acl.resource.name: acl.name for acl in pipeline_acls(settings) if acl.pattern is PatternType.PREFIXED}
    assert settings.group_id.startswith(prefixes["GROUP"])
    assert changelog_name(settings).startswith(prefixes["TOPIC"])
    transaction = TransactionManager.transactional_id_format.format(group_id=settings.group_id,
                                                                    tpg=TopicPartitionGroup("t", 3, 0))
    assert transaction.startswith(prefixes["TRANSACTIONAL_ID"])


def test_every_stage_finds_what_it_reads_and_writes():
    settings = Settings()
    names = topic_names(settings)
    needs = {(stage, acl.name, acl.operation.name) for acl in pipeline_acls(settings) for stage in acl.needed_by}
    flows = {"resize": ("frames", "scaled"), "infer": ("scaled", "detections"), "sink": ("joined", None)}
    for stage, (source, output) in flows.items():
        assert (stage, names[source], "READ") in needs
        assert output is None or (stage, names[output], "WRITE") in needs
        assert (stage, names["deadletter"], "WRITE") in needs
    assert {("join", names["frames"], "READ"), ("join", names["detections"], "READ"),
            ("join", names["joined"], "WRITE"), ("produce", names["frames"], "WRITE")} <= needs


def test_broker_env_prints_a_users_settings_or_says_it_has_none(tmp_path, capsys):
    assert main(["broker", "env", "--data-dir", str(tmp_path), "--port", "19092"]) == ExitCode.FAILURE
    assert "was started with --security — start it with `streamapp broker start --security sasl_ssl`" \
        in capsys.readouterr().err
    BrokerSecurity(tmp_path / "security").ensure()
    assert main(["broker", "env", "--user", "admin", "--data-dir", str(tmp_path), "--port", "19092"]) == 0
    out = capsys.readouterr().out
    assert "export STREAMAPP_BROKER=kafka://localhost:19092\n" in out
    assert f"export STREAMAPP_SASL_PASSWORD_FILE={tmp_path}/security/admin.password\n" in out
    assert BrokerSecurity(tmp_path / "security").password(ADMIN) not in out



@pytest.mark.parametrize("security, printed", [
    ({"mode": MUTUAL_TLS}, "export STREAMAPP_SSL_CERT_FILE="),
    ({"oauth": True}, "export STREAMAPP_SASL_MECHANISM=OAUTHBEARER\n"),
])
def test_broker_env_prints_the_settings_of_the_listener_the_broker_last_ran(tmp_path, capsys, security, printed):
    broker = LocalBroker(tmp_path, 19092, security=BrokerSecurity(tmp_path / "security", **security))
    broker.security.ensure()
    if broker.security.oauth:
        broker.security.token_endpoint.port_file.write_text("18080\n")
    broker._write_properties(19093)
    assert main(["broker", "env", "--data-dir", str(tmp_path), "--port", "19092"]) == 0
    assert printed in capsys.readouterr().out


# --- the local OAuth token endpoint (--oauth) --------------------------------------------------


def test_the_token_endpoint_grants_rs256_tokens_its_jwks_verifies_and_refuses_a_wrong_secret(tmp_path):
    import asyncio
    import base64
    import json
    import urllib.request

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    from streamapp.kafkasecurity import ClientCredentialsTokens, TokenEndpointError
    from streamapp.settings import Secret

    def decoded(part: str) -> bytes:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))

    security = BrokerSecurity(tmp_path / "security", oauth=True, token_lifetime_s=20)
    security.ensure()
    endpoint = security.token_endpoint
    endpoint.start()
    try:
        secret = Secret(endpoint.client_secret_file(PIPELINE).read_text().strip())
        began = time.time()
        token = asyncio.run(ClientCredentialsTokens(endpoint.token_url, PIPELINE, secret, "kafka").token())
        header, claims, signature = token.split(".")
        with urllib.request.urlopen(endpoint.jwks_url, timeout=10) as response:
            [jwk] = json.loads(response.read())["keys"]
        assert json.loads(decoded(header)) == {"alg": "RS256", "typ": "JWT", "kid": jwk["kid"]}
        public = rsa.RSAPublicNumbers(int.from_bytes(decoded(jwk["e"]), "big"),
                                      int.from_bytes(decoded(jwk["n"]), "big")).public_key()
        public.verify(decoded(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())
        payload = json.loads(decoded(claims))
        assert {key: payload[key] for key in ("iss", "aud", "sub", "scope")} == {
            "iss": endpoint.issuer, "aud": "kafka", "sub": "pipeline", "scope": "kafka"}
        assert payload["exp"] - payload["iat"] == 20 and began - 1 <= payload["iat"] <= time.time()
        with pytest.raises(TokenEndpointError, match="gave client 'pipeline' no token: HTTP 401"):
            asyncio.run(ClientCredentialsTokens(endpoint.token_url, PIPELINE, Secret("wrong")).token())
        assert secret.value not in endpoint.log_file.read_text() and token not in endpoint.log_file.read_text()
        # A length it will not read is refused at once (a negative one would wait for the connection's end).
        assert [first_line_of_answer(endpoint.port, length) for length in ("-5", "x", str(64 * 1024 + 1))] == \
            ["HTTP/1.0 400 Bad Request"] * 3
    finally:
        endpoint.stop()
    assert endpoint.running_pid() is None


def first_line_of_answer(port: int, content_length: str) -> str:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(f"POST /oauth2/token HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           f"Content-Length: {content_length}\r\n\r\n".encode())
        return connection.makefile("rb").readline().decode().strip()
