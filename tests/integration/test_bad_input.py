"""Bad input on every topic never stops a worker (R11, R13, R20): each bad record becomes exactly
one dead letter per stage that reads it, with the original bytes, the reason, the stage and the
source topic/partition/offset; a counter per stage; good frames around the bad ones still come out.

One worker process runs all four stages on the real broker; then decompression bombs (whole
JPEGs of 4 MiB that decode to 768 MiB) and the other crafted JPEGs of tests/jpegcraft.py go to a
resize, an infer and a sink worker, each in a 1 GiB budget, which must refuse them unread and
stay within it.
"""

import asyncio
import json
import math
import re
import struct
import time

import jpegcraft
import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from streamapp import wire
from streamapp.agents.source import synthetic_frames
from streamapp.cli.publisher import FramePublisher
from streamapp.imaging import encode_jpeg
from streamapp.jpeg import CorruptFrame, OverPixelBudget, jpeg_size
from streamapp.settings import Settings
from streamapp.sinkfiles import frame_path
from streamapp.tools.harness import read_topic, wait_for
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.workers import Worker
from streamapp.topicadmin import ensure_topics
from streamapp.topics import max_record_bytes, topic_names
from streamapp.wire import Frame, FrameId, Joined

pytestmark = pytest.mark.kafka

# Capture times are Kafka timestamps, which the broker refuses more than an hour ahead of its clock.
NOW_MS = int(time.time() * 1000)
PREFIX = struct.Struct(">2sBcI")
GOOD_FRAMES = 6


def _record(kind: bytes, header, body: bytes = b"", version: int = wire.VERSION) -> bytes:
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    return PREFIX.pack(wire.MAGIC, version, kind, len(header_bytes)) + header_bytes + body


def _frame_header(stream: str, **changes) -> dict:
    return {"stream": stream, "epoch": 1, "index": 0, "ts_ms": NOW_MS, "width": 160, "height": 120, **changes}


def _key(stream: str) -> bytes:
    return FrameId(stream, 1, 0).bucket_key(900)


def _joined(stream: str, jpeg: bytes) -> bytes:
    """A well-formed joined record, on a topic where only frames or results belong."""
    return _record(b"J", {**_frame_header(stream), "status": "unmatched"}, jpeg)


def _noise_jpeg() -> bytes:
    # Scaled up to the detector size this no longer fits a record: the producer refuses it.
    return encode_jpeg(np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8), 90)


def _small_jpeg() -> bytes:
    return encode_jpeg(np.full((120, 160, 3), 90, np.uint8), 90)


def bad_records(settings: Settings) -> list[tuple[str, str, bytes | None, bytes | None, set[str]]]:
    """(case, topic role, key, value, stages that must dead-letter it from this topic)."""
    jpeg = _small_jpeg()
    limit = max_record_bytes(settings)
    both = {"resize", "join"}
    detections = {"stream": "d", "epoch": 1, "index": 0, "model": "m", "latency_ms": 1.0,
                  "width": 160, "height": 120}
    box = {"label": "x", "score": 0.5, "x": 1, "y": 1, "w": 5, "h": 5}
    return [
        ("empty payload", "frames", b"k", b"", both),
        ("tombstone", "frames", b"k", None, both),
        ("not a record", "frames", None, b"hello world", both),
        ("unknown version", "frames", b"k", _record(b"F", _frame_header("v"), jpeg, version=9), both),
        ("header not JSON", "frames", b"k", _record(b"F", b"{nope", jpeg), both),
        ("missing stream", "frames", b"k", _record(b"F", {"epoch": 1, "index": 0}, jpeg), both),
        ("negative index", "frames", b"k", _record(b"F", _frame_header("n", index=-5), jpeg), both),
        ("absurd timestamp", "frames", b"k", _record(b"F", _frame_header("t", ts_ms=0), jpeg), both),
        ("over the frame limit", "frames", _key("big"),
         _record(b"F", _frame_header("big"), b"\xff\xd8" + bytes(settings.max_frame_bytes) + b"\xff\xd9"), both),
        ("at the record limit", "frames", b"k", b"\xff" * (limit - 100), both),
        ("size not as claimed", "frames", _key("size"), _record(b"F", _frame_header("size", width=320), jpeg),
         both),
        ("truncated JPEG", "frames", _key("cut"), _record(b"F", _frame_header("cut"), jpeg[:len(jpeg) // 2]),
         both),
        ("joined record on frames", "frames", _key("jf"), _joined("jf", jpeg), both),
        ("scaled copy too large to send", "frames", _key("noise"),
         _record(b"F", _frame_header("noise"), _noise_jpeg()), {"resize"}),
        ("not keyed by its bucket", "frames", b"cam:1:0", _record(b"F", _frame_header("wrongkey"), jpeg), {"join"}),
        ("garbage scaled frame", "scaled", b"k", b"\x00" * 40, {"infer"}),
        ("joined record on scaled frames", "scaled", _key("js"), _joined("js", jpeg), {"infer"}),
        ("joined record on detections", "detections", _key("jd"), _joined("jd", jpeg), {"join"}),
        ("NaN score", "detections", _key("d"),
         _record(b"D", {**detections, "boxes": [{**box, "score": math.nan}]}), {"join"}),
        ("box out of frame", "detections", _key("d"),
         _record(b"D", {**detections, "boxes": [{**box, "x": 158}]}), {"join"}),
        ("detections with a body", "detections", _key("d"), _record(b"D", {**detections, "boxes": []}, b"x"),
         {"join"}),
        ("garbage joined record", "joined", b"k", b"SA\x01J", {"sink"}),
        ("unknown joined status", "joined", _key("s"),
         _record(b"J", {**_frame_header("s"), "status": "maybe"}, jpeg), {"sink"}),
    ]




@pytest.fixture
def settings(kafka_bootstrap, tmp_path, unique_topic):
    return Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=2,
                    join_ttl_s=2.0, sweep_interval_s=0.5, done_marker_ttl_s=4.0,
                    max_frame_bytes=64 * 1024, resize_width=640, resize_height=480,
                    data_dir=tmp_path / "data", out_dir=tmp_path / "out", web_port=free_port())


async def _produce(settings: Settings, records) -> dict[str, tuple[int, int]]:
    """Good frames, then every bad record, then more good frames; returns each bad record's
    (partition, offset)."""
    names = topic_names(settings)
    good = [frame for frame, _ in synthetic_frames("good", 7, GOOD_FRAMES, 160, 120, seed=3, now_ms=NOW_MS)]
    where = {}
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, max_request_size=4 * 1024**2)
    await producer.start()
    try:
        async with FramePublisher(settings) as publisher:
            for frame in good[:GOOD_FRAMES // 2]:
                await publisher.publish(frame)
            await publisher.flush()
            for case, role, key, value, _ in records:
                sent = await producer.send_and_wait(names[role], value, key=key)
                where[case] = (sent.partition, sent.offset)
            last = good[-1]
            await producer.send_and_wait(names["frames"], wire.encode_frame(last),
                                         key=last.id.bucket_key(settings.bucket_size),
                                         headers=[("trace", b"any header is fine")])
            for frame in good[GOOD_FRAMES // 2:-1]:
                await publisher.publish(frame)
            await publisher.flush()
    finally:
        await producer.stop()
    return where


async def _dead_letters(settings: Settings, expected: int, timeout_s: float = 60.0) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        letters = await read_topic(settings, topic_names(settings)["deadletter"], 1)
        if len(letters) >= expected or time.monotonic() > deadline:
            return letters
        await asyncio.sleep(0.5)


def test_every_bad_record_costs_one_dead_letter_per_stage_and_work_goes_on(settings, tmp_path):
    asyncio.run(ensure_topics(settings))
    worker = Worker("all", settings, tmp_path)
    try:
        assert asyncio.run(wait_for(worker.ready, 120)) is not None, worker.log_path.read_text()[-3000:]
        records = bad_records(settings)
        where = asyncio.run(_produce(settings, records))
        good = [FrameId("good", 7, index) for index in range(GOOD_FRAMES)]
        assert asyncio.run(wait_for(lambda: all(frame_path(settings.out_dir, f).exists() for f in good), 120)) \
            is not None, "good frames around the bad ones must still come out"
        expected = sum(len(stages) for *_, stages in records)
        names = topic_names(settings)
        letters = asyncio.run(_dead_letters(settings, expected))
        headers = [{name: value.decode() for name, value in letter.headers} for letter in letters]
        sources = [(h["stage"], h["source_topic"], int(h["source_partition"]), int(h["source_offset"]))
                   for h in headers]
        assert len(sources) == len(set(sources)) == expected, "one dead letter per bad record and stage"
        by_source = dict(zip(sources, zip(letters, headers, strict=True), strict=True))
        for case, role, key, value, stages in records:
            for stage in stages:
                letter, header = by_source[(stage, names[role], *where[case])]
                assert header["reason"], case
                assert letter.key == key, case
                if case == "at the record limit":
                    assert letter.value == b"" and "original_dropped" in header
                else:
                    assert letter.value == value, case
        # Only the bad records sent to joined itself: the join lets no frame pass that the sink
        # could not draw.
        assert sum(source[:2] == ("sink", names["joined"]) for source in sources) == 2
        assert worker.process.poll() is None, "bad input must never stop the worker"
        stats = worker.stats()
        assert stats["gc_frozen_objects"] > 10_000, "full collections must skip what the worker built to start"
        for stage in ("resize", "infer", "join", "sink"):
            assert stats[f"{stage}_dead_lettered_total"] == sum(source[0] == stage for source in sources)
    finally:
        worker.stop()


# --- decompression bombs --------------------------------------------------------------------------

BOMBS = 3
BOMB_SIDE = 16384
MEMORY_BUDGET = 1024**3
BUDGET_REASON = re.compile(r"JPEG .*(to decode|scans), over the ")


def _hostile_frames(settings: Settings) -> list[tuple[Frame, bool]]:
    """The bombs, then the rest of the crafted corpus; each with whether the pixel budget (rather
    than a broken header or the wire format's size limit) must refuse it."""
    bomb = jpegcraft.flat_grey(BOMB_SIDE, BOMB_SIDE)
    crafted = [(jpeg, error is OverPixelBudget) for jpeg, error in jpegcraft.corpus(settings.frame_pixel_limit).values()
               if jpeg is not bomb]
    frames = []
    for index, (jpeg, over_budget) in enumerate([(bomb, True)] * BOMBS + crafted):
        try:
            width, height = jpeg_size(jpeg)
        except CorruptFrame:
            width, height = 64, 48
        over_budget &= max(width, height) <= wire.MAX_DIMENSION
        frames.append((Frame(FrameId("bomb", 1, index), NOW_MS, width, height, jpeg), over_budget))
    return frames


async def _send_hostile_among_good_frames(settings: Settings) -> dict[tuple[str, int, int], bool]:
    """To each decoding stage's input, good records with a hostile one after each; returns where
    each hostile record went (topic, partition, offset), with whether the budget refuses it."""
    names = topic_names(settings)
    hostile = _hostile_frames(settings)
    good = [frame for frame, _ in synthetic_frames("good", 7, len(hostile), 320, 240, seed=5, now_ms=NOW_MS)]
    encoders = {"frames": wire.encode_frame, "scaled": wire.encode_frame,
                "joined": lambda frame: wire.encode_joined(Joined(frame, None))}
    sent_to = {}
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                                max_request_size=max_record_bytes(settings))
    await producer.start()
    try:
        for role, encode in encoders.items():
            for frame, (bad, over_budget) in zip(good, hostile, strict=True):
                for record in (frame, bad):
                    sent = await producer.send_and_wait(names[role], encode(record),
                                                        key=record.id.bucket_key(settings.bucket_size))
                sent_to[(names[role], sent.partition, sent.offset)] = over_budget
    finally:
        await producer.stop()
    return sent_to


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory in bytes (the kernel's VmHWM)."""
    status = open(f"/proc/{pid}/status").read()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024


def test_bombs_are_refused_unread_and_each_decoding_worker_stays_in_budget(
        kafka_bootstrap, tmp_path, unique_topic):
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=1,
                        max_frame_bytes=8 * 1024**2, memory_budget_bytes=MEMORY_BUDGET,
                        data_dir=tmp_path / "data", out_dir=tmp_path / "out")
    asyncio.run(ensure_topics(settings))
    workers = {stage: Worker(stage, settings.replace(stages=(stage,), web_port=free_port(),
                                                     data_dir=tmp_path / stage), tmp_path)
               for stage in ("resize", "infer", "sink")}
    try:
        for worker in workers.values():
            assert asyncio.run(wait_for(worker.ready, 120)) is not None, worker.log_path.read_text()[-3000:]
        hostile = asyncio.run(_send_hostile_among_good_frames(settings))
        good = bad = len(hostile) // 3
        over_budget = sum(hostile.values()) // 3

        def done() -> bool:
            stats = {stage: worker.stats() for stage, worker in workers.items()}
            return (stats["resize"]["resize_frames_out_total"] == good
                    and stats["infer"]["infer_results_total"] == 2 * good  # sent to it, and resize's
                    and stats["sink"]["sink_frames_written_total"] == good
                    and all(stats[stage][f"{stage}_dead_lettered_total"] == bad for stage in workers))
        assert asyncio.run(wait_for(done, 120)) is not None, {stage: w.stats() for stage, w in workers.items()}

        names = topic_names(settings)
        stage_of = {names["frames"]: "resize", names["scaled"]: "infer", names["joined"]: "sink"}
        letters = asyncio.run(_dead_letters(settings, len(hostile)))
        headers = [{name: value.decode() for name, value in letter.headers} for letter in letters]
        refused = {(h["source_topic"], int(h["source_partition"]), int(h["source_offset"])): (h["stage"], h["reason"])
                   for h in headers}
        assert refused.keys() == hostile.keys()
        for where, by_budget in hostile.items():
            stage, reason = refused[where]
            assert stage == stage_of[where[0]] and bool(BUDGET_REASON.match(reason)) == by_budget, (where, reason)
        bomb_reasons = {reason for _, reason in refused.values() if reason.startswith(f"JPEG of {BOMB_SIDE}x")}
        assert bomb_reasons == {f"JPEG of {BOMB_SIDE}x{BOMB_SIDE} takes 1.5GiB to decode, over the 64.0MiB of a "
                                f"frame of {settings.frame_pixel_limit} pixels — lower the frame's resolution, or "
                                "raise STREAMAPP_MEMORY_BUDGET (the budget is a sixteenth of it) or "
                                "STREAMAPP_MAX_FRAME_PIXELS"}
        for stage, worker in workers.items():
            assert worker.process.poll() is None, f"the {stage} worker stopped"
            assert worker.stats()[f"{stage}_over_pixel_budget_total"] == over_budget
            peak = _peak_rss(worker.process.pid)
            print(f"{stage} worker: peak RSS {peak / 1024**2:.0f} MiB")
            assert peak < MEMORY_BUDGET, f"the {stage} worker peaked at {peak / 1024**2:.0f} MiB"
    finally:
        for worker in workers.values():
            worker.stop()
