"""``streamapp bench join`` end to end on a small input: its own broker, the plain copy, Kafka
Streams (unless Maven cannot build it here), Quix Streams and the join worker, backlog and one
live rate.

Asserts what the bench counts, not how fast anything is.
"""

from __future__ import annotations

import json

import pytest

from streamapp.tools.bench import kstreams
from streamapp.tools.bench.join import JoinBenchOptions, run_join_bench
from streamapp.tools.localkafka.common import BrokerError

PAIRS = 300
RATE = 100.0


def systems_that_build() -> tuple[str, ...]:
    try:
        kstreams.ensure_build()
    except BrokerError:
        return ("copy", "quix", "streamapp", "streamapp-tls")
    return ("copy", "kstreams", "quix", "streamapp", "streamapp-tls")


@pytest.mark.kafka
def test_bench_join_runs_every_system_and_writes_its_report(tmp_path):
    systems = systems_that_build()
    # One try of one rate: a step the loaded test machine fails is still one step here.
    options = JoinBenchOptions(pairs=PAIRS, rates=(RATE,), live_seconds=2.0, warmup_s=1.0, retries=0,
                               systems=systems, out=tmp_path, drain_timeout_s=60.0)
    report = run_join_bench(options, "streamapp bench join --pairs 300")

    assert json.loads((tmp_path / "report.json").read_text())["systems"].keys() == set(systems)
    assert "| plain copy (aiokafka) |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "join.png").stat().st_size > 10_000
    for name in systems:
        system = report["systems"][name]
        assert "error" not in system, system.get("error")
        backlog, (step,) = system["backlog"], system["live"]["steps"]
        assert backlog["pairs_out"] == PAIRS and backlog["pairs_per_s"] > 0 and backlog["peak_rss_bytes"] > 0
        # A small backlog may drain mostly before the process reports ready, in under a clock tick
        # of CPU after it: the process's CPU is read when its start-up shows some.
        assert backlog["startup_cpu_s"] > 0 and backlog["cpu_s_per_1k_pairs"] >= 0, name
        assert step["pairs"] == 200 and step["latency_s"]["count"] > 0
    for name in {"kstreams", "quix"} & set(systems):
        assert report["systems"][name]["backlog"]["joined_fraction"] == 1.0, name
        assert report["systems"][name]["backlog"]["frames_out_twice"] == 0, name
        assert report["systems"][name]["backlog"]["peak_pending_bytes"] > 0, name
    ours = report["systems"]["streamapp"]["backlog"]
    assert ours["joined"] + ours["unmatched"] == PAIRS  # every frame left the join once
    # The worker over the broker's SASL_SSL listener, the load and reader on PLAINTEXT: the ratios,
    # from its drains in the order A B B A after an uncounted one.
    assert [drain["system"] for drain in report["tls"]["drains"]] == [
        "streamapp", "streamapp-tls", "streamapp-tls", "streamapp"]
    assert len(report["tls"]["backlog_ratios"]) == 2 and "## Over SASL_SSL, order balanced" in (
        tmp_path / "report.md").read_text()
    assert report["ratios"]["tls_backlog_vs_plaintext"] > 0 and report["ratios"]["tls_cpu_per_pair_vs_plaintext"] > 0
    # Only the worker under test meets the SASL_SSL listener (advertised as localhost): the other
    # worker, and every load and reader, the PLAINTEXT one on 127.0.0.1.
    worker_log = {name: (tmp_path / "logs" / f"{name}-backlog" / "join.log").read_text()
                  for name in ("streamapp", "streamapp-tls")}
    for name, listener, other in (("streamapp-tls", "localhost", "127.0.0.1"), ("streamapp", "127.0.0.1", "localhost")):
        assert f"kafka://{listener}:" in worker_log[name] and f"kafka://{other}:" not in worker_log[name], name


@pytest.mark.kafka
def test_bench_join_drain_rounds_alternate_the_order_and_give_balanced_ratios(tmp_path):
    options = JoinBenchOptions(pairs=PAIRS, rates=(RATE,), live_seconds=1.0, warmup_s=1.0, retries=0,
                               systems=("copy", "copy-librdkafka", "streamapp"), out=tmp_path, drain_timeout_s=60.0,
                               drain_rounds=1)
    report = run_join_bench(options, "streamapp bench join --pairs 300 --drain-rounds 1")

    drains = report["drains"]
    assert [drain["system"] for drain in drains["drains"]] == [
        "copy", "copy-librdkafka", "streamapp", "streamapp", "copy-librdkafka", "copy"]
    assert all(drain["complete"] and drain["pairs_per_s"] > 0 for drain in drains["drains"])
    assert [drain["joined_fraction"] for drain in drains["drains"]][2:4] == [1.0, 1.0]
    assert len(drains["backlog_vs_copy_per_pass"]) == 2 and report["ratios"]["balanced_backlog_vs_copy"] > 0
    # The copy on librdkafka copied both records of every pair (counted as the aiokafka copy's are).
    assert report["systems"]["copy-librdkafka"]["backlog"]["pairs_out"] == PAIRS
    assert report["ratios"]["balanced_backlog_vs_copy-librdkafka"] > 0
    assert "## Backlog drains, order balanced" in (tmp_path / "report.md").read_text()
