"""Synthetic frame/result pairs as the benchmarks publish them (:class:`PairLoad`): a few
pre-encoded JPEGs reused with new ids, each result a few frames after its frame (as inference
would), the load's producer, and plain topics for baselines."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streamapp import wire
from streamapp.agents.source import SyntheticScene, to_frame
from streamapp.cli.publisher import producer_config
from streamapp.kafkasecurity import client_options
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes
from streamapp.wire import new_epoch

RESULT_LAG = 3          # a result is published this many frames after its frame
DISTINCT_FRAMES = 8     # pre-encoded JPEGs, reused with new ids
FRAME = "frame"
RESULT = "result"


def encoded_frames(width: int, height: int) -> list[bytes]:
    scene = SyntheticScene(width, height, seed=5)
    return [to_frame(wire.FrameId("soak", 1, index), 0, scene.render(index)[0]).jpeg
            for index in range(DISTINCT_FRAMES)]


def detections_for(frame_id: wire.FrameId, width: int, height: int) -> wire.Detections:
    box = wire.Box("object", 0.9, width // 4, height // 4, width // 8, height // 8)
    return wire.Detections(frame_id, (box,), "soak", 1.0, width, height)


def publish_order(start: int, count: int, lag: int = RESULT_LAG) -> Iterator[tuple[str, int]]:
    """``(FRAME, i)`` and ``(RESULT, i)`` for pairs ``start .. start+count-1``: each result
    ``lag`` frames after its frame, the last ``lag`` results after the last frame."""
    for index in range(start, start + count + lag):
        if index < start + count:
            yield FRAME, index
        if index - lag >= start:
            yield RESULT, index - lag


async def pace(rate: float, index: int, started: float) -> None:
    """Sleep until pair ``index`` is due at ``rate`` per second from ``started`` (monotonic);
    at rate 0 only yield now and then, so readers and samplers run."""
    if rate:
        ahead = started + index / rate - time.monotonic()
        if ahead > 0.002:
            await asyncio.sleep(ahead)
    elif index % 64 == 0:
        await asyncio.sleep(0)


def load_producer(settings: Settings) -> AIOKafkaProducer:
    """The load's producer, configured as every tool's (:func:`producer_config`)."""
    return AIOKafkaProducer(**producer_config(settings))


@dataclasses.dataclass(frozen=True)
class Cameras:
    """Pair ``i`` is frame ``i // count`` of camera ``cam<i % count>``: the cameras share the rate."""

    count: int

    def frame_id(self, epoch: int, pair: int) -> wire.FrameId:
        return wire.FrameId(f"cam{pair % self.count}", epoch, pair // self.count)

    def pair_of(self, stream: str, index: int) -> int:
        return index * self.count + int(stream.removeprefix("cam"))


class PairLoad:
    """Publishes pairs into a frames and a results topic: each frame, then ``RESULT_LAG`` frames
    later its result (unless ``withhold(index)``: inference stalled), both with the frame's capture
    time as the Kafka timestamp. Its counters are current while it publishes."""

    def __init__(self, producer, frames_topic: str, results_topic: str, key_of: Callable[[wire.FrameId], bytes],
                 size: tuple[int, int], cameras: Cameras,
                 withhold: Callable[[int], bool] = lambda index: False) -> None:
        self.producer = producer
        self.frames_topic, self.results_topic = frames_topic, results_topic
        self.key_of = key_of
        self.size = size
        self.jpegs = encoded_frames(*size)
        self.epoch = new_epoch()
        self.cameras = cameras
        self.withhold = withhold
        self.result_sent_at: dict[int, float] = {}   # wall time each result went out
        self.frames_sent = 0
        self.frame_bytes = 0
        self.published = 0      # pairs whose result is out
        self.next_index = 0
        self.frame_record_bytes = 0

    async def publish(self, count: int, rate: float, capture_ms: Callable[[int], int] | None = None) -> float:
        """``count`` more pairs at ``rate`` per second (0: as fast as the broker takes them),
        captured at ``capture_ms(index)`` (default: now). Returns the seconds it took."""
        width, height = self.size
        start, started = self.next_index, time.monotonic()
        captured: dict[int, int] = {}
        for kind, index in publish_order(start, count):
            frame_id = self.cameras.frame_id(self.epoch, index)
            if kind == FRAME:
                await pace(rate, index - start, started)
                stamp = captured[index] = capture_ms(index) if capture_ms else int(time.time() * 1000)
                jpeg = self.jpegs[index % len(self.jpegs)]
                value = wire.encode_frame(wire.Frame(frame_id, stamp, width, height, jpeg))
                await self.producer.send(self.frames_topic, value, key=self.key_of(frame_id), timestamp_ms=stamp)
                self.frames_sent += 1
                self.frame_bytes += len(value)
                self.frame_record_bytes = len(value)
            elif self.withhold(index):
                del captured[index]
            else:
                result = wire.encode_detections(detections_for(frame_id, width, height))
                await self.producer.send(self.results_topic, result, key=self.key_of(frame_id),
                                         timestamp_ms=captured.pop(index))
                self.result_sent_at[index] = time.time()
                self.published += 1
        await self.producer.flush()
        self.next_index = start + count
        return time.monotonic() - started


async def create_plain_topics(settings: Settings, names: list[str]) -> None:
    """Topics outside the pipeline's own set, with its partition count and record size limit."""
    admin = AIOKafkaAdminClient(**client_options(settings))
    await admin.start()
    config = {"max.message.bytes": str(max_record_bytes(settings)), "retention.ms": str(3600 * 1000)}
    try:
        await admin.create_topics([NewTopic(name, settings.partitions, settings.replication_factor,
                                            topic_configs=config) for name in names])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()

