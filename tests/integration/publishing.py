"""Publishing helper shared by the integration tests that drive workers with synthetic frames."""

from __future__ import annotations

from streamapp import wire
from streamapp.agents.source import new_epoch, synthetic_frames
from streamapp.publisher import FramePublisher
from streamapp.settings import Settings


async def publish_frames(settings: Settings, stream: str, count: int, *, seed: int) -> list[wire.FrameId]:
    """Publish ``count`` small synthetic frames of a new epoch of ``stream``; return their ids."""
    frames = [frame for frame, _ in synthetic_frames(stream, new_epoch(), count, 160, 120, seed=seed)]
    async with FramePublisher(settings) as publisher:
        for frame in frames:
            await publisher.publish(frame)
        await publisher.flush()
    return [frame.id for frame in frames]
