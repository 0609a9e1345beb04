"""Resize stage: a frame scaled to the detector's input size, still a JPEG.

The scaled copy keeps the frame's id and timestamp and records the original size in
``source_width/height``, so inference can map its boxes back to the original pixels. The size is
exact, not aspect-preserving: the mapping back is a per-axis scale.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamapp import wire
from streamapp.batches import acked_when_done
from streamapp.imaging import UNUSABLE_PIXELS, decode_frame, encode_jpeg
from streamapp.opencv import cv2
from streamapp.wire import Frame

if TYPE_CHECKING:
    from streamapp.worker.stage import Stage


def resize_frame(frame: Frame, width: int, height: int, quality: int = 90) -> Frame:
    """The frame scaled to ``width`` x ``height``; raises CorruptFrame for an undecodable JPEG."""
    image = decode_frame(frame)  # also checks frames that need no scaling
    if (frame.width, frame.height) == (width, height):
        jpeg = frame.jpeg  # already the right size: re-encoding would only lose quality
    else:
        jpeg = encode_jpeg(cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA), quality)
    return Frame(
        id=frame.id,
        timestamp_ms=frame.timestamp_ms,
        width=width,
        height=height,
        jpeg=jpeg,
        source_width=frame.source_width or frame.width,
        source_height=frame.source_height or frame.height,
    )


# Frames a resize batch takes at most, and the longest the first waits for others: under
# exactly-once a batch is one transaction per input partition, which costs a few round trips.
BATCH_FRAMES = 16
BATCH_WAIT_S = 0.01


def register(stage: Stage) -> None:
    """Faust agent: ``frames`` -> ``frames.scaled``; undecodable frames are dead-lettered."""
    topics = stage.topics
    stage.metrics.declare("resize_frames_in_total", "resize_frames_out_total", "resize_over_pixel_budget_total")
    commit = stage.batch_commit("resize", topics.frames)

    @stage.app.agent(topics.frames, name="resize")
    async def resize(stream):
        async for events in acked_when_done(stream.take_events(BATCH_FRAMES, within=BATCH_WAIT_S)):
            async with commit(events):
                for event in events:
                    await _resize_event(stage, event)


async def _resize_event(stage: Stage, event) -> None:
    settings, topics = stage.settings, stage.topics
    stage.metrics.inc("resize_frames_in_total")
    try:
        frame = wire.decode_frame(event.value, max_frame_bytes=settings.max_frame_bytes)
        scaled = await stage.offload(resize_frame, frame, settings.resize_width,
                                     settings.resize_height, settings.jpeg_quality)
    except (wire.WireError, *UNUSABLE_PIXELS) as exc:
        await stage.dead_letters.refuse(event, stage="resize", error=exc)
        return
    if await stage.dead_letters.emit(event, stage="resize", topic=topics.scaled,
                                     key=frame.id.bucket_key(settings.bucket_size),
                                     value=wire.encode_frame(scaled),
                                     timestamp=event.message.timestamp):
        stage.metrics.inc("resize_frames_out_total")
