"""The broker restarts mid-run: the worker reconnects by itself and every frame still comes out.

The test runs a broker of its own (never the session's) and one worker with all four stages.
"""

import asyncio

import pytest

from streamapp.settings import Settings
from streamapp.sinkfiles import frame_path
from streamapp.tools.harness import publish_frames, read_joined, wait_for
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.workers import Worker
from streamapp.topicadmin import ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

FRAMES_PER_PHASE = 30


@pytest.fixture
def broker(kafka_bootstrap, tmp_path):
    # Depends on the session broker only to be skipped or failed with it (same jars, same Java).
    own = LocalBroker(tmp_path / "broker", free_port())
    own.start(timeout=120)
    try:
        yield own
    finally:
        own.stop()


def test_workers_reconnect_after_a_broker_restart_and_lose_nothing(broker, tmp_path):
    # A TTL far beyond the outage: a frame waiting for its result must not expire meanwhile.
    settings = Settings(broker=f"kafka://{broker.bootstrap}", partitions=2, join_ttl_s=90.0,
                        sweep_interval_s=0.5, done_marker_ttl_s=120.0, data_dir=tmp_path / "data",
                        out_dir=tmp_path / "out", web_port=free_port())
    asyncio.run(ensure_topics(settings))
    worker = Worker("all", settings, tmp_path)
    try:
        assert asyncio.run(wait_for(worker.ready, 120)) is not None
        ids = asyncio.run(publish_frames(settings, "before", FRAMES_PER_PHASE, seed=4))
        broker.stop()  # while the worker is still busy with those frames
        asyncio.run(asyncio.sleep(3))
        broker.start(timeout=120)
        ids += asyncio.run(publish_frames(settings, "after", FRAMES_PER_PHASE, seed=4))

        files = [frame_path(settings.out_dir, frame_id) for frame_id in ids]
        assert asyncio.run(wait_for(lambda: all(path.exists() for path in files), 180)) is not None, \
            f"{sum(not path.exists() for path in files)} of {len(files)} frames missing"
        assert worker.process.poll() is None, "no restart of the worker needed"
        joined = asyncio.run(read_joined(settings))
        assert set(joined.copies) == set(ids)
        not_joined = {str(frame_id): sorted(outcome) for frame_id, outcome in joined.outcomes.items()
                      if outcome != {"joined"}}
        assert not not_joined, "every result met its frame"
    finally:
        worker.stop()
