"""The pure parts of ``streamapp bench join``: argument validation, the sustained-rate decision,
the backlog summary, the report, its markdown and chart, and how outputs are counted."""

from __future__ import annotations

import asyncio

import cv2
import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from streamapp.cli.main import main
from streamapp.settings import Settings
from streamapp.tools.bench import join, quixjoin, rdkafkacopy
from streamapp.tools.bench.join import Bench, JoinBenchOptions, LibrdkafkaCopy, Outputs, parse_join_key
from streamapp.tools.bench.join_report import (
    backlog_summary,
    balanced_drains,
    balanced_tls,
    build_report,
    describe_machine,
    draw_chart,
    is_sustained,
    lag_slope,
    markdown,
    max_latency_held,
    max_sustained,
    ratios,
    refine_rate,
    step_summary,
)
from streamapp.tools.bench.pairs import FRAME, RESULT, Cameras, publish_order
from streamapp.tools.localkafka.security import make_certificates


@pytest.mark.parametrize("argv, reason", [
    (["--rates", "300,150"], "expected rising rates, got 150 after 300"),
    (["--rates", "150,abc"], "expected a number, got 'abc'"),
    (["--rates", "0,150"], "expected rates above 0"),
    (["--live-seconds", "-1"], "expected seconds above 0"),
    (["--pairs", "0"], "expected at least 1"),
    (["--backlog-rate", "0"], "expected a steady rate above 0"),
    (["--systems", "flink"], "invalid choice: 'flink'"),
    (["--streams", "0"], "expected at least 1"),
    (["--drain-rounds", "-1"], "expected at least 0, got -1"),
])
def test_bad_arguments_are_one_usage_error_before_a_broker_starts(capsys, argv, reason):
    assert main(["bench", "join", *argv]) == 2
    err = capsys.readouterr().err
    assert reason in err and err.count("error:") == 1


def lag_points(growth_per_s: float, seconds: int = 9) -> list[tuple[float, float]]:
    return [(t / 2, 40 + growth_per_s * t / 2 + (5 if t % 2 else -5)) for t in range(2 * seconds)]


def raw_step(rate=300.0, pairs=3000, publish_s=10.0, growth=0.0, joined=3000, out=3000):
    return {"rate": rate, "pairs": pairs, "publish_s": publish_s, "lag": lag_points(growth), "drained": True,
            "pairs_out": out, "joined": joined, "latencies_s": [0.01 * (i % 10 + 1) for i in range(pairs)],
            "cpu_s": {"system": publish_s / 2, "load": publish_s / 4}}


def test_lag_slope_is_the_growth_per_second_despite_jitter():
    assert lag_slope(lag_points(30.0)) == pytest.approx(30.0, abs=1.5)
    assert lag_slope(lag_points(0.0)) == pytest.approx(0.0, abs=1.5)
    assert lag_slope([(1.0, 5.0)]) == 0.0


def test_a_step_is_sustained_only_when_joined_offered_and_lag_flat():
    assert step_summary(raw_step(), joins=True)["sustained"]
    assert not step_summary(raw_step(joined=2990), joins=True)["sustained"]  # 99.67 % joined
    assert step_summary(raw_step(joined=2998), joins=True)["sustained"]      # 99.93 %
    assert not step_summary(raw_step(growth=40.0), joins=True)["sustained"]  # lag grows 13 % of the rate
    short = step_summary(raw_step(publish_s=12.0), joins=True)               # the load offered 250/s
    assert not short["offered"] and not short["sustained"]
    copied = step_summary(raw_step(joined=0), joins=False)                   # a copy joins nothing
    assert copied["joined_fraction"] is None and copied["sustained"]
    assert step_summary(raw_step(), joins=True)["latency_s"]["p99"] == pytest.approx(0.1)
    assert step_summary(raw_step(), joins=True)["cores"] == {"system": 0.5, "load": 0.25}


def test_max_sustained_rate_is_the_top_of_the_sustained_run_and_says_what_ended_it():
    def step(rate, sustained=True, offered=True):
        return {"rate": rate, "sustained": sustained, "offered": offered}

    assert max_sustained([step(150), step(300), step(450, sustained=False)]) == {"rate": 300, "limited_by": "system"}
    assert max_sustained([step(150), step(300)]) == {"rate": 300, "limited_by": "rates"}
    assert max_sustained([step(150), step(300, offered=False)]) == {"rate": 150, "limited_by": "load"}
    assert max_sustained([step(150, sustained=False)]) == {"rate": None, "limited_by": "system"}
    retried = [step(150), step(300, sustained=False), step(300), step(450, sustained=False),
               step(450, sustained=False)]
    assert max_sustained(retried) == {"rate": 300, "limited_by": "system"}   # one try of 300 was enough
    assert refine_rate(retried) == 375


def test_the_maximum_by_latency_holds_through_bursts_of_output_and_ends_where_latency_grows():
    def step(rate: float, growth: float, p99: float, joined: float = 1.0) -> dict:
        found = {"rate": rate, "pairs": int(rate * 10), "offered": True, "out_fraction": joined,
                 "joined_fraction": joined, "lag_growth_pairs_per_s": growth, "latency_s": {"count": 9, "p99": p99}}
        return {**found, "sustained": is_sustained(found)}

    # Output in bursts: the lag slope fails 300/s with latency flat, and passes 900/s 3.7 s behind.
    bursty = [step(150.0, 3.0, 1.3), step(300.0, 25.0, 1.5), step(450.0, -10.0, 1.75), step(900.0, -20.0, 5.0)]
    assert max_sustained(bursty)["rate"] == 150.0 and max_latency_held(bursty) == 450.0  # allowed 1.3 + 0.5 s
    assert max_latency_held([step(150.0, 0.0, 0.02), step(300.0, 0.0, 0.3, joined=0.99)]) == 150.0
    assert max_latency_held([]) is None


def test_refined_rates_halve_the_gap_between_the_highest_sustained_and_the_lowest_not():
    def step(rate, sustained=True, offered=True):
        return {"rate": rate, "sustained": sustained, "offered": offered}

    ladder = [step(2250), step(2700), step(3150), step(3600, sustained=False)]
    assert refine_rate(ladder) == 3375
    assert refine_rate([*ladder, step(3375)]) == 3488                    # sustained: the upper half
    assert refine_rate([*ladder, step(3375, sustained=False)]) == 3262   # not: the lower half
    assert max_sustained([*ladder, step(3375), step(3488, sustained=False)])["rate"] == 3375
    assert refine_rate([step(3150), step(3190, sustained=False)]) is None  # within MIN_REFINE_GAP
    assert refine_rate([step(150, sustained=False)]) is None             # nothing sustained
    assert refine_rate([step(150), step(300, offered=False)]) is None    # the load ended the run
    assert refine_rate([step(150), step(300)]) is None                    # every rate sustained


def ladder_run(retries: int, capacity: float, *, drains: bool = True, stalls: frozenset = frozenset(),
               offered: bool = True) -> list[float]:
    """The rates a bench tries against a system that sustains up to ``capacity``, except on the
    first try of each rate in ``stalls`` (a host stall)."""
    bench = Bench.__new__(Bench)
    bench.options = JoinBenchOptions(rates=(150.0, 300.0, 450.0, 600.0), refine_steps=2, retries=retries)
    steps: list[dict] = []
    for rate in bench.rates_to_try(steps):
        stalled = rate in stalls and all(step["rate"] != rate for step in steps)
        steps.append({"rate": rate, "offered": offered, "sustained": rate <= capacity and not stalled,
                      "drained": drains or rate <= capacity})
    return [step["rate"] for step in steps]


def test_the_ladder_stops_at_the_first_rate_not_sustained_then_refines_while_the_system_drains():
    assert ladder_run(0, capacity=400) == [150, 300, 450, 375, 412]
    assert ladder_run(0, capacity=1000) == [150, 300, 450, 600]          # every rate sustained
    assert ladder_run(0, capacity=400, drains=False) == [150, 300, 450]  # still behind: nothing to refine
    assert ladder_run(0, capacity=100) == [150]
    assert ladder_run(0, capacity=400, stalls=frozenset({300})) == [150, 300, 225, 262]  # a stall decides the top


def test_a_step_not_sustained_is_tried_again_once_the_system_caught_up():
    assert ladder_run(1, capacity=400, stalls=frozenset({300})) == [150, 300, 300, 450, 450, 375, 412, 412]
    assert ladder_run(1, capacity=400) == [150, 300, 450, 450, 375, 412, 412]
    assert ladder_run(2, capacity=100) == [150, 150, 150]
    assert ladder_run(1, capacity=400, drains=False) == [150, 300, 450]  # still behind: no second try
    assert ladder_run(1, capacity=100, offered=False) == [150]           # the load's limit, not the system's


def raw_backlog(**changes):
    samples = [{"t": t, "rss_bytes": 100 + t, "cpu_s": t, "pending_bytes": None if t == 0 else 10 * t,
                "published": 2000, "out": 0} for t in range(5)]
    return {"pairs": 2000, "published_s": 3.0, "startup_s": 2.0, "startup_cpu_s": 1.5, "drain_s": 4.0, "cpu_s": 3.0,
            "pairs_out": 2000, "joined": 1990, "frames_out_twice": 0, "counters": {"join_unmatched_frames_total": 10},
            "samples": samples,
            **changes}


def test_backlog_summary():
    summary = backlog_summary(raw_backlog(), joins=True)
    assert summary["pairs_per_s"] == 500.0 and summary["cpu_s_per_1k_pairs"] == 1.5
    assert summary["joined_fraction"] == 0.995 and summary["unmatched"] == 10 and summary["frames_out_twice"] == 0
    assert summary["peak_pending_bytes"] == 40 and summary["peak_rss_bytes"] == 104 and summary["complete"]
    copy = backlog_summary(raw_backlog(counters={}, pairs_out=1500), joins=False)
    assert copy["joined_fraction"] is None and copy["unmatched"] is None and not copy["complete"]


def sample_report() -> dict:
    steps = [step_summary(raw_step(rate=150.0, pairs=1500, publish_s=10.0), joins=True),
             step_summary(raw_step(growth=100.0), joins=True),
             step_summary(raw_step(growth=90.0), joins=True),
             step_summary(raw_step(rate=225.0, pairs=2250, publish_s=10.0, joined=2250, out=2250), joins=True)]
    live = {"steps": steps, "max_sustained": max_sustained(steps), "max_latency_held": max_latency_held(steps),
            "counters": {}}
    systems = {
        "copy": {"label": "plain copy", "pending_measure": None,
                 "backlog": backlog_summary(raw_backlog(counters={}), joins=False), "live": live},
        "kstreams": {"label": "Kafka Streams", "pending_measure": "state dir bytes",
                     "backlog": backlog_summary(raw_backlog(counters={}, drain_s=8.0), joins=True), "live": live},
        "streamapp": {"label": "streamapp join worker", "pending_measure": "join_pending_bytes",
                      "error": "TimeoutError: timed out waiting for the worker"},
    }
    options = {"command": "streamapp bench join --pairs 2000", "partitions": 4, "width": 640, "height": 480,
               "frame_record_bytes": 49_000, "streams": 1, "result_lag": 3, "ttl_s": 5.0, "pairs": 2000,
               "backlog_rate": 150.0,
               "live_seconds": 10.0, "rates": [150.0, 300.0], "warmup_s": 5.0, "refine_steps": 2, "retries": 1}
    versions = {"kafka_broker": "4.1.1", "kafka_streams": "4.4.0", "java": "openjdk 17", "kstreams_jvm": "-Xmx1g",
                "faust": "0.15.3", "aiokafka": "0.14.0", "python": "3.11.7"}
    return build_report(options, versions, systems, describe_machine())


def test_report_markdown_describes_the_machine_and_every_system():
    report = sample_report()
    assert report["ratios"]["backlog_vs_kstreams"] is None  # our worker did not run
    text = markdown(report)
    assert "nproc" in text and "load average" in text and report["machine"]["cpu"] in text
    assert "| plain copy | 500 | 1.50 | – |" in text
    assert "| Kafka Streams | 250 | 1.50 | 99.50 % |" in text
    assert "| Kafka Streams | 225 | " in text and "✗" in text  # 300/s: lag grew; 225/s refined
    assert "| 225/s: 60 / 100 ms, 100.0 %, +0/s |" in text
    assert "+100/s ✗ → 60 / 100 ms, 100.0 %, +90/s ✗ |" in text            # both tries of 300/s
    assert "tried once more once the system has caught up" in text
    assert "streamapp join worker: TimeoutError" in text
    assert "Maximum by latency instead of lag" in text and "plain copy 300; Kafka Streams 300 pairs/s." in text
    assert "Kafka Streams at 300/s: 0.50 cores, the load 0.25" in text


def test_chart_is_one_png_with_both_panels(tmp_path):
    draw_chart(tmp_path / "join.png", sample_report())
    image = cv2.imread(str(tmp_path / "join.png"))
    assert image is not None and image.shape[:2] == (960, 960)  # two 960x480 panels, one above the other


def test_publish_order_puts_each_result_a_few_frames_after_its_frame():
    order = list(publish_order(10, 5, lag=3))
    assert [index for kind, index in order if kind == FRAME] == [10, 11, 12, 13, 14]
    assert [index for kind, index in order if kind == RESULT] == [10, 11, 12, 13, 14]
    assert order.index((RESULT, 10)) == order.index((FRAME, 13)) + 1


def test_cameras_share_the_pairs_round_robin():
    cameras = Cameras(10)
    frame_id = cameras.frame_id(1796, 123)
    assert (frame_id.stream, frame_id.index) == ("cam3", 12)
    assert cameras.pair_of(*parse_join_key(frame_id.join_key())) == 123


def test_a_pair_is_out_once_its_frame_and_its_result_are():
    outputs = Outputs(Cameras(1), result_sent_at={7: 100.0})
    outputs.pair_out("cam0", 7, True, 100.25)  # the copy's result record, or a joined record
    assert outputs.pairs == 0 and outputs.latencies == {7: 0.25}
    outputs.frames += 1
    assert outputs.pairs == 1 and outputs.frames_out_twice == 0
    outputs.frames += 1                        # the same frame again, unmatched this time
    assert outputs.pairs == 1 and outputs.frames_out_twice == 1


def test_ratios_against_quix_streams_are_backlog_cpu_live_and_memory():
    def system(pairs_per_s: float, cpu: float, rss: int, live: float) -> dict:
        return {"backlog": {"pairs_per_s": pairs_per_s, "cpu_s_per_1k_pairs": cpu, "peak_rss_bytes": rss},
                "live": {"max_sustained": {"rate": live}}}

    found = ratios({"quix": system(4000.0, 0.2, 1000, 150.0), "streamapp": system(6000.0, 0.1, 400, 1800.0)})
    assert (found["backlog_vs_quix"], found["cpu_per_pair_vs_quix"], found["live_max_vs_quix"],
            found["peak_rss_vs_quix"]) == (1.5, 0.5, 12.0, 0.4)
    assert ratios({"streamapp": system(6000.0, 0.1, 400, 1800.0)})["backlog_vs_quix"] is None


def test_the_tls_ratio_is_the_geometric_mean_of_neighbouring_pairs_cancelling_a_drift():
    def drain(system: str, pairs_per_s: float, cpu: float) -> dict:
        return {"system": system, "pairs_per_s": pairs_per_s, "cpu_s_per_1k_pairs": cpu,
                "broker_cpu_s_per_1k_pairs": None, "samples": []}

    # TLS costs 0.8x; each drain runs 10 % faster than the one before it (the drift).
    speeds = [1000 * 1.1**index for index in range(4)]
    drains = [drain("streamapp", speeds[0], 0.2), drain("streamapp-tls", 0.8 * speeds[1], 0.3),
              drain("streamapp-tls", 0.8 * speeds[2], 0.3), drain("streamapp", speeds[3], 0.2)]
    tls = balanced_tls(drains)
    assert tls["backlog_ratios"] == [0.88, 0.727]  # A B looks cheaper than TLS is, B A dearer
    assert tls["backlog_vs_plaintext"] == 0.8 and tls["cpu_per_pair_vs_plaintext"] == 1.5
    assert tls["broker_cpu_per_pair_vs_plaintext"] is None and "samples" not in tls["drains"][0]
    found = ratios({}, tls)
    assert (found["tls_backlog_vs_plaintext"], found["tls_cpu_per_pair_vs_plaintext"]) == (0.8, 1.5)
    assert ratios({})["tls_backlog_vs_plaintext"] is None


def test_every_system_drains_in_passes_that_alternate_the_order():
    bench = Bench.__new__(Bench)
    order: list[str] = []

    async def backlog(system, phase: str) -> dict:
        order.append(f"{system.name}:{phase}")
        return {"pairs_per_s": 1.0}

    bench.backlog = backlog
    systems = [type("System", (), {"name": name})() for name in ("copy", "kstreams", "streamapp")]
    drains = asyncio.run(bench.balanced_drains(systems, 2, "drain"))
    assert order == ["copy:drain-1", "kstreams:drain-2", "streamapp:drain-3", "streamapp:drain-4",
                     "kstreams:drain-5", "copy:drain-6", "copy:drain-7", "kstreams:drain-8", "streamapp:drain-9",
                     "streamapp:drain-10", "kstreams:drain-11", "copy:drain-12"]
    assert drains[0] == {"system": "copy", "pairs_per_s": 1.0}


def test_balanced_drain_ratios_cancel_a_drift_over_the_run():
    # The worker drains 2x Kafka Streams and 0.9x the copy; each drain runs 10 % faster than the one before.
    truth = {"copy": 1000.0, "kstreams": 450.0, "streamapp": 900.0}
    names = ["copy", "kstreams", "streamapp"]
    order = [*names, *reversed(names)]
    drains = [{"system": name, "pairs_per_s": truth[name] * 1.1**index, "cpu_s_per_1k_pairs": 0.1,
               "complete": True, "joined_fraction": None, "samples": []} for index, name in enumerate(order)]
    found = balanced_drains(drains, names)
    assert found["backlog_vs_kstreams_per_pass"] == [2.2, 1.818]  # one pass flatters the worker, the next not
    assert (found["backlog_vs_kstreams"], found["backlog_vs_copy"]) == (2.0, 0.9)
    assert found["cpu_per_pair_vs_kstreams"] == 1.0 and "samples" not in found["drains"][0]
    assert found["median_pairs_per_s"]["kstreams"] == pytest.approx(450 * (1.1 + 1.1**4) / 2)
    found_ratios = ratios({}, drains=found)
    assert (found_ratios["balanced_backlog_vs_kstreams"], found_ratios["balanced_backlog_vs_quix"]) == (2.0, None)
    # A pass without one system's rate (it failed) leaves that comparison without a balanced ratio.
    drains[4]["pairs_per_s"] = None
    assert balanced_drains(drains, names)["backlog_vs_kstreams"] is None
    assert balanced_drains(drains, names)["backlog_vs_copy"] == 0.9


def test_the_plain_copies_against_kafka_streams_give_each_clients_limit():
    # Each client's copy drains 2x and 5x Kafka Streams; each drain runs 10 % faster than the one before.
    truth = {"copy": 1000.0, "copy-librdkafka": 2500.0, "kstreams": 500.0, "streamapp": 900.0}
    names = list(truth)
    drains = [{"system": name, "pairs_per_s": truth[name] * 1.1**index, "cpu_s_per_1k_pairs": 0.1,
               "complete": True, "joined_fraction": None} for index, name in enumerate([*names, *reversed(names)])]
    found = balanced_drains(drains, names)
    assert (found["copy_backlog_vs_kstreams"], found["copy-librdkafka_backlog_vs_kstreams"]) == (2.0, 5.0)
    assert found["backlog_vs_copy-librdkafka"] == 0.36
    found_ratios = ratios({}, drains=found)
    assert found_ratios["balanced_copy-librdkafka_backlog_vs_kstreams"] == 5.0
    assert found_ratios["balanced_backlog_vs_copy-librdkafka"] == 0.36
    report = {**sample_report(), "drains": found}
    report["systems"]["copy-librdkafka"] = {"label": "plain copy (librdkafka)"}
    assert ("The plain copies against Kafka Streams, balanced: plain copy 2.00×; plain copy (librdkafka) 5.00×"
            in markdown(report))
    # Without Kafka Streams in the rounds there is nothing to hold the copies against.
    without = balanced_drains([drain for drain in drains if drain["system"] != "kstreams"],
                              [name for name in names if name != "kstreams"])
    assert "copy-librdkafka_backlog_vs_kstreams" not in without


def test_the_librdkafka_copy_is_configured_as_librdkafka_accepts_with_the_projects_security(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(make_certificates("broker.example").ca_pem)
    settings = Settings.from_env({"STREAMAPP_BROKER": "kafka://broker.example:9093", "STREAMAPP_SECURITY_PROTOCOL":
                                  "SASL_SSL", "STREAMAPP_SASL_MECHANISM": "SCRAM-SHA-512", "STREAMAPP_SASL_USERNAME":
                                  "bench", "STREAMAPP_SASL_PASSWORD": "s3cret", "STREAMAPP_SSL_CA_FILE": str(ca)})
    consumer, producer = rdkafkacopy.client_configs(settings, "bench-group")
    for config in (consumer, producer):
        assert (config["bootstrap.servers"], config["security.protocol"], config["sasl.username"]) == (
            "broker.example:9093", "SASL_SSL", "bench")
    # librdkafka refuses a property it does not know, or a value out of its range, when the client is made.
    Consumer(consumer).close()
    Producer(producer).flush(0)


def test_the_librdkafka_copy_raises_the_first_failed_delivery_of_a_batch_once():
    delivery = rdkafkacopy.Delivery()
    delivery(None, None)
    first, second = KafkaError(KafkaError._MSG_TIMED_OUT), KafkaError(KafkaError._QUEUE_FULL)
    delivery(first, None)
    delivery(second, None)
    assert delivery.take() is first and delivery.take() is None


def test_the_librdkafka_copy_is_not_run_without_confluent_kafka(monkeypatch):
    monkeypatch.setattr(join, "installed_version", lambda name: None)
    with pytest.raises(RuntimeError, match=r"confluent-kafka is not installed: pip install 'streamapp\[bench\]'"):
        LibrdkafkaCopy(Settings.from_env({}))


def test_the_report_lists_the_balanced_drains():
    report = sample_report()
    names = ["copy", "kstreams"]
    report["drains"] = balanced_drains(
        [{"system": name, "pairs_per_s": 500.0, "cpu_s_per_1k_pairs": 0.2, "complete": True, "joined_fraction": None}
         for name in [*names, *reversed(names)]], names)
    text = markdown(report)
    assert "## Backlog drains, order balanced" in text and "2 passes" in text
    assert "| 4 | plain copy | 500 | 0.200 | – |" in text
    assert "Median pairs/s: plain copy 500; Kafka Streams 500." in text
    assert "Did not run: OSError" in markdown({**report, "drains": {"error": "OSError: disk full"}})


@pytest.mark.parametrize("value", [b"\x01{\"frame\": 1}", b"", 7, {"counter": 2**40}])
def test_the_quix_join_stores_record_bytes_raw_and_its_own_values_as_json(value):
    stored = quixjoin.dumps(value)
    assert quixjoin.loads(stored) == value
    if isinstance(value, bytes):
        assert stored == quixjoin.RAW + value  # a frame is stored once, not escaped into JSON
