"""Replay scenarios against one join worker on the real broker, judged against the prediction.

Every scenario replays its recording with fresh epochs into the same worker, one after the other,
so their keys never meet; each waits until the worker holds nothing pending before the next starts.
Each prints one line: frames, results, joined, unmatched, orphan, late, duplicates, max pending.
"""

from __future__ import annotations

import asyncio

import pytest

from streamapp.tools.replay.predict import predict
from streamapp.tools.replay.scenario import Scenario

from harness import (
    SCENARIOS,
    SLACK_S,
    expected_counts,
    join_settings,
    judge_outputs,
    most_sent_within,
    plan_for,
    run_scenario,
    start_join,
    to_pipeline,
    unmatched_departures,
)

pytestmark = pytest.mark.replay

SHARED = sorted(SCENARIOS.glob("*.json"))  # those in restarts/ need workers of their own


@pytest.fixture(scope="module", params=["at_least_once", "exactly_once"])
def join_worker(kafka_bootstrap, tmp_path_factory, request):
    """One join worker for every scenario of this module (they share the join's settings), one
    per processing guarantee: the outcomes are the same under either."""
    folder = tmp_path_factory.mktemp("replay-join")
    settings = join_settings(kafka_bootstrap, Scenario.load(SHARED[0]), folder / "data", request.param)
    worker = start_join(settings, folder / "logs")
    yield worker, settings
    worker.stop()


@pytest.mark.parametrize("path", SHARED, ids=[path.stem for path in SHARED])
def test_scenario(path, join_worker):
    worker, settings = join_worker
    scenario = Scenario.load(path)
    assert scenario.settings(settings) == settings, "the scenario needs a join with other settings"
    plan = plan_for(scenario, settings)
    records = list(to_pipeline(plan.records(), settings))
    prediction = predict(records, settings, speed=plan.speed)

    outcome = asyncio.run(run_scenario(worker, settings, records, plan.speed, prediction))
    print("\n" + outcome.line(scenario.name))

    assert outcome.counts == expected_counts(scenario, prediction)
    assert judge_outputs(outcome, prediction) == []
    # Each frame that leaves unmatched left no earlier than its partner could no longer arrive
    # (TTL after it was sent, or once its side's results were sent past its event time + TTL),
    # and no later than TTL + one sweep interval after it was stored, which is at most the
    # worker's consumer lag after it was sent.
    ttl, sweep, lag = settings.join_ttl_s, settings.sweep_interval_s, outcome.lag_s
    departures = unmatched_departures(outcome, ttl)
    early = [d for d in departures if d.left_ms < d.earliest_ms]
    assert not early, f"{len(early)} frames left before their partner could no longer arrive: {early[:3]}"
    late = [d for d in departures if d.left_ms - d.sent_ms > (lag + ttl + sweep + SLACK_S) * 1000]
    assert not late, f"{len(late)} frames left late (lag {lag:.1f} s): {late[:3]}"
    # Pending state holds no more than what arrived within TTL + sweep, and drains to zero once
    # both inputs are idle.
    assert outcome.max_pending_entries <= most_sent_within(outcome.sent, lag + ttl + sweep + SLACK_S)
    assert outcome.drained_after_s is not None and outcome.drained_after_s <= lag + ttl + sweep + SLACK_S
