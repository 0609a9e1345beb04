"""A short soak on the real broker: inference stalls mid-run, and the join's memory and disk stay
bounded while the naive dict join keeps every frame that never got a result.

Asserts bounds on bytes and counts only; the times in the report are not judged here.
"""

from __future__ import annotations

from streamapp.tools.bench.soak import run_soak
from streamapp.tools.bench.soak_state import SoakOptions

MIB = 1024**2
PAIRS = 5000
RATE = 250.0
STALL_S = 6.0
BUDGET = 384 * MIB


def test_short_soak_with_stalled_inference_stays_bounded(kafka_bootstrap, tmp_path):
    report = run_soak(SoakOptions(pairs=PAIRS, rate=RATE, scenario="stall", stall_s=STALL_S, baseline="naive",
                                  memory_budget_bytes=BUDGET, out=tmp_path, bootstrap=kafka_bootstrap,
                                  drain_timeout_s=90))
    ours, naive, samples = report["ours"], report["naive"], report["samples"]
    frame_bytes = report["mean_frame_record_bytes"]
    stalled = PAIRS - report["results_sent"]
    assert stalled > 0

    # Every frame left the join exactly once: with its result, or flagged after the TTL.
    assert ours["out"] == PAIRS
    assert ours["matched"] == report["results_sent"]

    # Memory: under the budget at every sample, RocksDB inside its share.
    assert all(sample["ours"]["rss_bytes"] < BUDGET for sample in samples)
    assert all(sample["ours"]["rocksdb_memory_bytes"] <= BUDGET // 4 for sample in samples)

    # Pending state is what a TTL's worth of input holds, however long inference stalls, and
    # nothing is left once the input stops.
    ttl_worth = report["input_pairs_per_s"] * report["join_ttl_s"] * frame_bytes
    assert ours["peak_pending_bytes"] <= 2 * ttl_worth
    assert samples[-1]["ours"]["pending_bytes"] < 0.01 * ours["peak_pending_bytes"] + 64 * 1024
    assert ours["peak_rocksdb_disk_bytes"] <= ours["rocksdb_disk_bound_bytes"]

    # The naive join still holds every frame of the stall, and more memory for it.
    assert naive["final_pending_bytes"] >= stalled * frame_bytes * 0.9
    assert naive["final_pending_bytes"] > 10 * samples[-1]["ours"]["pending_bytes"]
