"""SIGKILL on the real broker (R12, R4): nothing lost end to end, nothing written twice at the
sink, and pending join entries come back from the local store or from the changelog alone and
still expire."""

import asyncio

import pytest

from streamapp.settings import Settings
from streamapp.sinkfiles import frame_path
from streamapp.tools.chaos import ChaosOptions, run_chaos
from streamapp.tools.harness import Pipeline, publish_frames, read_joined, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


def test_killing_each_stage_under_load_loses_and_duplicates_nothing(kafka_bootstrap, tmp_path):
    port = int(kafka_bootstrap.rsplit(":", 1)[1])
    options = ChaosOptions(kills=4, streams=1, fps=8.0, pause_s=(1.0, 3.0), wipe_join_store_every=1,
                           join_ttl_s=20.0, seed=7, out=tmp_path / "chaos", broker_port=port)
    report = run_chaos(options, Settings(partitions=2))

    assert report["kills_by_stage"] == {"resize": 1, "infer": 1, "join": 1, "sink": 1}
    assert report["join_stores_wiped"] == 1
    assert report["frames_produced"] > 0
    assert report["lost"] == 0, report["lost_examples"]
    assert report["sink_duplicates"] == 0
    assert report["joined_missing"] == 0
    assert report["recovery_s"]["not_recovered"] == 0
    assert (tmp_path / "chaos" / "chaos.json").exists()


PENDING = 12


@pytest.fixture(params=["at_least_once", "exactly_once"])
def join_and_sink(kafka_bootstrap, tmp_path, unique_topic, request):
    """A join and a sink worker and nothing upstream: frames wait in the join for results that
    never come, until their TTL."""
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=2,
                        join_ttl_s=20.0, sweep_interval_s=0.5, done_marker_ttl_s=30.0,
                        out_dir=tmp_path / "out", processing_guarantee=request.param)
    pipeline = Pipeline(settings, tmp_path)
    try:
        pipeline.start_all(("join", "sink"))
        yield settings, pipeline
    finally:
        pipeline.stop()


def _gauge(pipeline: Pipeline, name: str) -> float:
    try:
        return pipeline.workers["join"].stats().get(name, 0)
    except OSError:
        return 0


@pytest.mark.parametrize("store", ["local store", "changelog alone"])
def test_pending_entries_survive_a_kill_and_still_expire(join_and_sink, store):
    settings, pipeline = join_and_sink
    ids = asyncio.run(publish_frames(settings, "pending", PENDING, seed=1))
    assert asyncio.run(wait_for(lambda: _gauge(pipeline, "join_frames_in_total") == PENDING, 60)) is not None

    pipeline.kill("join", wipe_store=store == "changelog alone")
    pipeline.start("join")
    # The entries are back before their deadline passes (the TTL outlasts the restart) ...
    assert asyncio.run(wait_for(lambda: _gauge(pipeline, "join_state_entries") == PENDING, 60)) is not None
    # ... and leave unmatched at their deadline, with nothing left to feed or sweep them but the timer.
    files = [frame_path(settings.out_dir, frame_id) for frame_id in ids]
    assert asyncio.run(wait_for(lambda: all(path.exists() for path in files), 90)) is not None
    joined = asyncio.run(read_joined(settings))
    assert set(joined.copies) == set(ids)
    assert all(outcome == {"unmatched"} for outcome in joined.outcomes.values())
