"""OAUTHBEARER against the broker started with ``--security sasl_ssl --oauth --acls`` (the
``oauth_kafka`` fixture): its users are clients of a local OAuth token endpoint, whose RS256
tokens the broker checks against the endpoint's JWKS. Tokens live SHORT_TOKEN_LIFETIME_S and
the broker ends a connection's session with its token, so a client that kept working past
that did authenticate again with a fresh token."""

from __future__ import annotations

import time

from streamapp.errors import ExitCode
from streamapp.tools.localkafka.security import ADMIN, PIPELINE

from conftest import SHORT_TOKEN_LIFETIME_S
from secured import assert_one_line, resize_worker, run_cli, run_worker, scaled_frames, user_env


def tokens_issued(oauth_kafka, client_id: str) -> int:
    log = oauth_kafka.security.token_endpoint.log_file.read_text()
    return log.count(f"issued a token to client {client_id!r}")


def test_the_cli_and_a_worker_keep_working_past_their_tokens_lifetime(oauth_kafka, tmp_path):
    made = run_cli(user_env(oauth_kafka, ADMIN), "topics", "create")
    assert made.returncode == 0, made.stderr
    env = user_env(oauth_kafka, PIPELINE)
    produced = run_cli(env, "produce", "--synthetic", "--frames", "3")
    assert produced.returncode == 0, produced.stderr
    with resize_worker(env, tmp_path):
        assert scaled_frames(oauth_kafka, 3) == 3
        issued = tokens_issued(oauth_kafka, PIPELINE)
        time.sleep(SHORT_TOKEN_LIFETIME_S * 1.5)  # the worker's first token has expired
        produced = run_cli(env, "produce", "--synthetic", "--frames", "3")
        assert produced.returncode == 0, produced.stderr
        assert scaled_frames(oauth_kafka, 6) == 6
    # One token for the second `produce`, at least one more for the worker.
    assert tokens_issued(oauth_kafka, PIPELINE) >= issued + 2


def test_a_wrong_client_secret_is_one_line_naming_the_endpoint_and_client(oauth_kafka, tmp_path):
    env = user_env(oauth_kafka, PIPELINE, STREAMAPP_OAUTH_CLIENT_SECRET_FILE="",
                   STREAMAPP_OAUTH_CLIENT_SECRET="wrong-password-not-to-be-shown")
    token_url = oauth_kafka.security.token_endpoint.token_url
    for proc in (run_cli(env, "produce", "--synthetic", "--frames", "2"), run_worker(env, tmp_path, "resize")):
        assert_one_line(proc, ExitCode.AUTH_FAILED, f"the OAuth token endpoint {token_url} gave client 'pipeline' "
                        "no token: HTTP 401", "STREAMAPP_OAUTH_CLIENT_SECRET")
