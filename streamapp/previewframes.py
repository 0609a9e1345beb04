"""What the live preview shows: the newest annotated frame of each stream, in memory.

:class:`LatestFrames` holds it within a byte budget (``STREAMAPP_PREVIEW_BYTES``); when a new
stream does not fit, the least recently updated streams are evicted and counted. The sink fills
it; the worker's preview pages (streamapp.worker.preview) read it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

from streamapp.wire import Joined


@dataclasses.dataclass(frozen=True)
class PreviewFrame:
    stream: str
    epoch: int
    index: int
    boxes: int
    matched: bool
    jpeg: bytes
    version: int  # changes with every new frame of any stream, so the page can tell what changed

    def describe(self) -> dict:
        return {"stream": self.stream, "epoch": self.epoch, "index": self.index, "boxes": self.boxes,
                "matched": self.matched, "bytes": len(self.jpeg), "version": self.version}


class LatestFrames:
    """Newest annotated frame per stream, least recently updated first, at most ``max_bytes``.

    Written from the sink's pixel thread and read from the web handlers, hence the lock.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted = 0
        self._frames: collections.OrderedDict[str, PreviewFrame] = collections.OrderedDict()
        self._versions = 0
        self._lock = threading.Lock()

    def show(self, joined: Joined, jpeg: bytes) -> None:
        """Keep ``jpeg`` as the stream's frame, unless the stream already shows a later one
        (frames leave the join out of order: unmatched ones a TTL late)."""
        frame_id = joined.frame.id
        with self._lock:
            held = self._frames.get(frame_id.stream)
            if held is not None and (held.epoch, held.index) > (frame_id.epoch, frame_id.index):
                return
            self._versions += 1
            self._put(PreviewFrame(
                stream=frame_id.stream, epoch=frame_id.epoch, index=frame_id.index,
                boxes=len(joined.detections.boxes) if joined.detections else 0,
                matched=joined.matched, jpeg=jpeg, version=self._versions))

    def _put(self, frame: PreviewFrame) -> None:
        held = self._frames.pop(frame.stream, None)
        if held is not None:
            self.bytes -= len(held.jpeg)
        self._frames[frame.stream] = frame
        self.bytes += len(frame.jpeg)
        while self.bytes > self.max_bytes:
            _, evicted = self._frames.popitem(last=False)
            self.bytes -= len(evicted.jpeg)
            self.evicted += 1

    def get(self, stream: str) -> PreviewFrame | None:
        with self._lock:
            return self._frames.get(stream)

    def streams(self) -> list[dict]:
        with self._lock:
            frames = list(self._frames.values())
        return [frame.describe() for frame in sorted(frames, key=lambda frame: frame.stream)]

    def gauges(self) -> dict[str, float]:
        with self._lock:
            return {"preview_streams": len(self._frames), "preview_bytes": self.bytes,
                    "preview_streams_evicted_total": self.evicted}
