"""Connecting to a secured Kafka as a user meets it: the broker of ``secure_kafka`` (SASL_SSL,
SCRAM-SHA-512, ACLs on), a real ``streamapp`` command and a real worker in subprocesses.
Each failure is one line ``streamapp: error: ...`` on stderr naming what to fix, with its own
exit code; the pipeline user holding only its documented ACLs works, as far as those go."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import pytest

from streamapp.errors import ExitCode
from streamapp.settings import Settings
from streamapp.tools.localkafka.acls import create_acls, pipeline_acls
from streamapp.tools.localkafka.processes import free_port, run_async
from streamapp.tools.localkafka.security import ADMIN, PIPELINE, make_certificates
from streamapp.tools.workers import Worker, wait_until
from streamapp.topicadmin import ConfigRefused, create_topics
from streamapp.topics import TopicSpec, changelog_name, topic_names

from secured import PIPELINE_PASSWORD_MARK, assert_one_line, run_cli, run_worker, user_env


@pytest.fixture(scope="module")
def topics_made_by_admin(secure_kafka):
    """The pipeline's topics, made by the admin as an operator would: ``streamapp topics create``."""
    made = run_cli(user_env(secure_kafka, ADMIN), "topics", "create")
    assert made.returncode == 0, made.stderr
    return secure_kafka


def both_ways(env: dict[str, str], tmp_path: Path) -> list[subprocess.CompletedProcess]:
    """``streamapp produce`` and a worker, with the same settings."""
    return [run_cli(env, "produce", "--synthetic", "--frames", "2"), run_worker(env, tmp_path)]


def test_the_pipeline_user_verifies_existing_topics_and_produces(topics_made_by_admin, tmp_path):
    env = user_env(topics_made_by_admin, PIPELINE)
    verified = run_cli(env, "topics", "create")
    assert verified.returncode == 0 and "created: none" in verified.stdout, verified.stderr
    produced = run_cli(env, "produce", "--synthetic", "--frames", "3")
    assert produced.returncode == 0, produced.stderr


def test_a_wrong_password_names_broker_mechanism_user_and_settings(topics_made_by_admin, tmp_path):
    env = user_env(topics_made_by_admin, PIPELINE, STREAMAPP_SASL_PASSWORD_FILE="",
                   STREAMAPP_SASL_PASSWORD=PIPELINE_PASSWORD_MARK)
    for proc in both_ways(env, tmp_path):
        assert_one_line(proc, ExitCode.AUTH_FAILED, f"the broker {topics_made_by_admin.bootstrap} refused SASL "
                        "SCRAM-SHA-512 authentication of user 'pipeline'", "STREAMAPP_SASL_PASSWORD")


def test_an_untrusted_ca_names_the_ca_file_setting(topics_made_by_admin, tmp_path):
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(make_certificates("localhost").ca_pem)
    env = user_env(topics_made_by_admin, PIPELINE, STREAMAPP_SSL_CA_FILE=str(other_ca))
    for proc in both_ways(env, tmp_path):
        assert_one_line(proc, ExitCode.CERTIFICATE_UNTRUSTED, "is not trusted",
                        f"STREAMAPP_SSL_CA_FILE={other_ca} did not sign it")


def test_a_hostname_the_certificate_does_not_name_says_so(topics_made_by_admin, tmp_path):
    port = topics_made_by_admin.bootstrap.rsplit(":", 1)[1]
    env = user_env(topics_made_by_admin, PIPELINE, STREAMAPP_BROKER=f"kafka://127.0.0.1:{port}")
    for proc in both_ways(env, tmp_path):
        assert_one_line(proc, ExitCode.HOSTNAME_MISMATCH, f"certificate of broker 127.0.0.1:{port} does not name "
                        "'127.0.0.1'", "STREAMAPP_SSL_CHECK_HOSTNAME")


def test_a_missing_acl_names_the_principal_the_operation_and_the_resource(topics_made_by_admin, tmp_path):
    # The pipeline user's ACLs are for the default topics and the app id `streamapp`.
    other_topics = user_env(topics_made_by_admin, PIPELINE, STREAMAPP_TOPIC_PREFIX="unlisted.")
    produced = run_cli(other_topics, "produce", "--synthetic", "--frames", "2")
    assert_one_line(produced, ExitCode.NOT_AUTHORIZED, "User:pipeline may not WRITE topic unlisted.frames",
                    "docs/operations.md, Kafka ACLs")
    other_group = user_env(topics_made_by_admin, PIPELINE, STREAMAPP_APP_ID="unlisted")
    worker = run_worker(other_group, tmp_path)
    assert_one_line(worker, ExitCode.NOT_AUTHORIZED, "User:pipeline may not READ consumer group unlisted-infer")


def test_missing_topics_a_user_may_not_create_are_listed_for_an_admin(topics_made_by_admin, tmp_path):
    env = user_env(topics_made_by_admin, PIPELINE, STREAMAPP_TOPIC_PREFIX="unmade.")
    names = topic_names(Settings(topic_prefix="unmade."))
    for proc in (run_cli(env, "topics", "create"), run_worker(env, tmp_path)):
        assert_one_line(proc, ExitCode.TOPICS_MISSING, names["frames"], names["deadletter"],
                        "User:pipeline may not create them", "`streamapp topics create` and admin credentials")


def test_a_config_the_broker_refuses_is_named_with_its_setting(topics_made_by_admin):
    settings = Settings.from_env(topics_made_by_admin.admin_env())

    async def create():
        from aiokafka.admin import AIOKafkaAdminClient

        from streamapp.kafkasecurity import client_options
        admin = AIOKafkaAdminClient(**client_options(settings))
        await admin.start()
        try:
            await create_topics(admin, settings, [TopicSpec("refused-config", 1, {"max.message.bytes": "-1"})])
        finally:
            await admin.close()

    with pytest.raises(ConfigRefused) as refused:
        asyncio.run(create())
    assert "refused topic refused-config's max.message.bytes" in str(refused.value)
    assert "max.message.bytes comes from STREAMAPP_MAX_FRAME_BYTES" in str(refused.value)
    assert refused.value.exit_code == ExitCode.CONFIG_REFUSED


def test_an_admin_makes_the_changelogs_of_the_layouts_the_pipeline_user_runs(secure_kafka, tmp_path):
    """The join changelog's name comes from the worker's stage set. An admin's `topics create`
    makes the one of each stage set asked for (--stages), by default those of all four stages in
    one worker and of one worker per stage, whatever the admin's own STREAMAPP_STAGES: a join
    worker run alone as the pipeline user, who may not create topics, then finds its changelog."""
    prefix = f"layouts-{uuid.uuid4().hex[:8]}."
    pipeline = user_env(secure_kafka, PIPELINE, STREAMAPP_TOPIC_PREFIX=prefix)
    acls = pipeline_acls(Settings.from_env(pipeline))
    run_async(lambda: create_acls(secure_kafka.bootstrap, f"User:{PIPELINE}", acls, secure_kafka.client_options(ADMIN)))
    admin = user_env(secure_kafka, ADMIN, STREAMAPP_TOPIC_PREFIX=prefix)
    changelog = {stages: changelog_name(Settings(topic_prefix=prefix, stages=stages))
                 for stages in [("join",), ("resize", "join"), ("resize", "infer", "join", "sink")]}

    asked = run_cli(admin, "topics", "create", "--stages", "resize,join")
    assert asked.returncode == 0, asked.stderr
    assert changelog["resize", "join"] in asked.stdout and changelog["join",] not in asked.stdout

    made = run_cli(admin, "topics", "create")
    assert made.returncode == 0, made.stderr
    assert changelog["join",] in made.stdout and changelog["resize", "infer", "join", "sink"] in made.stdout

    join = Settings.from_env({**pipeline, "STREAMAPP_STAGES": "join", "STREAMAPP_DATA_DIR": str(tmp_path / "data"),
                              "STREAMAPP_WEB_PORT": str(free_port())})
    worker = Worker("join", join, tmp_path)
    try:
        wait_until(worker.ready, 120, "the pipeline user's join worker to be ready")  # not exit 15
    finally:
        worker.stop()
