"""The Kafka Streams join's client.properties holds the SASL password: readable by its owner only,
also where a wider file of that name was left in its folder."""

from __future__ import annotations

import stat

from streamapp.settings import Settings
from streamapp.tools.bench.kstreams import write_client_properties

SCRAM = {"STREAMAPP_SECURITY_PROTOCOL": "SASL_SSL", "STREAMAPP_SASL_MECHANISM": "SCRAM-SHA-512",
         "STREAMAPP_SASL_USERNAME": "pipeline", "STREAMAPP_SASL_PASSWORD": "hunter2-secret"}


def test_the_properties_are_the_owner_s_only_even_over_a_wider_file(tmp_path):
    left = tmp_path / "client.properties"
    left.write_text("old\n")
    left.chmod(0o644)

    path = write_client_properties(Settings.from_env(SCRAM), tmp_path)

    assert path == left and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "hunter2-secret" in path.read_text()
