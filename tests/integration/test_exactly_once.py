"""Exactly-once on the real broker (R22): resize, infer and the join killed with SIGKILL
mid-stream, again and again, and restarted (the join every other time without its store); what a
read_committed consumer of their topics sees holds every frame once: none lost, none twice, none
both joined and unmatched."""

import pytest

from streamapp.settings import Settings
from streamapp.tools.chaos import ChaosOptions, run_chaos

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


def test_killing_the_stages_that_write_commits_every_output_once(kafka_bootstrap, tmp_path):
    port = int(kafka_bootstrap.rsplit(":", 1)[1])
    options = ChaosOptions(kills=6, stages=("resize", "infer", "join"), streams=1, fps=10.0, pause_s=(1.0, 2.5),
                           wipe_join_store_every=2, join_ttl_s=20.0, processing_guarantee="exactly_once", seed=3,
                           out=tmp_path / "chaos", broker_port=port)
    report = run_chaos(options, Settings(partitions=2))

    assert report["kills_by_stage"] == {"resize": 2, "infer": 2, "join": 2}
    assert report["frames_produced"] > 0
    assert report["lost"] == 0, report["lost_examples"]
    assert report["duplicates_by_topic"] == {"frames.scaled": 0, "detections": 0, "joined": 0}
    assert report["joined_missing"] == 0
    assert report["joined_and_unmatched"] == 0
    assert report["recovery_s"]["not_recovered"] == 0
    assert report["workers_exited"] == []
