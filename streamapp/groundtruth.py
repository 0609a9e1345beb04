"""Ground truth of synthetic scenes: the true boxes, their JSON-lines file, and box matching.

The file has one line per frame, written as the source produces it::

    {"stream": "cam1", "epoch": 1717..., "index": 0, "boxes": [{"label": "red", "x": .., "y": .., "w": .., "h": ..}]}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, NamedTuple, Protocol

from streamapp.wire import FrameId


class TruthBox(NamedTuple):
    """Where an object really is, in the original frame's pixels."""

    label: str
    x: int
    y: int
    w: int
    h: int

    def as_json(self) -> dict:
        return self._asdict()


class LabelledRect(Protocol):
    """A labelled box in pixels; read-only, so named tuples and frozen boxes qualify."""

    @property
    def label(self) -> str: ...
    @property
    def x(self) -> int: ...
    @property
    def y(self) -> int: ...
    @property
    def w(self) -> int: ...
    @property
    def h(self) -> int: ...


def iou(a: LabelledRect, b: LabelledRect) -> float:
    """Intersection over union of two boxes given as top-left corner plus width and height."""
    overlap_w = min(a.x + a.w, b.x + b.w) - max(a.x, b.x)
    overlap_h = min(a.y + a.h, b.y + b.h) - max(a.y, b.y)
    if overlap_w <= 0 or overlap_h <= 0:
        return 0.0
    overlap = overlap_w * overlap_h
    return overlap / (a.w * a.h + b.w * b.h - overlap)


@dataclasses.dataclass(frozen=True)
class FrameMatch:
    """How one frame's predicted boxes compare with its true boxes.

    ``ious`` has one entry per true box: the IoU of the prediction matched to it, 0.0 if none.
    """

    ious: tuple[float, ...]
    missed: int
    extra: int

    @property
    def ok(self) -> bool:
        return self.missed == 0 and self.extra == 0

    @property
    def mean_iou(self) -> float:
        """Mean over the true boxes; a frame with nothing to find scores 1.0 when nothing was found."""
        if not self.ious:
            return 1.0 if self.extra == 0 else 0.0
        return sum(self.ious) / len(self.ious)


def match_boxes(predicted: Sequence[LabelledRect], truth: Sequence[LabelledRect], threshold: float = 0.5) -> FrameMatch:
    """Pair predictions with true boxes one-to-one, same label only, best IoU first (greedy)."""
    candidates = sorted(
        ((iou(p, t), p_index, t_index)
         for p_index, p in enumerate(predicted)
         for t_index, t in enumerate(truth)
         if p.label == t.label),
        reverse=True,
    )
    ious = [0.0] * len(truth)
    used_predictions: set[int] = set()
    used_truth: set[int] = set()
    for overlap, p_index, t_index in candidates:
        if overlap < threshold:
            break
        if p_index in used_predictions or t_index in used_truth:
            continue
        used_predictions.add(p_index)
        used_truth.add(t_index)
        ious[t_index] = overlap
    return FrameMatch(tuple(ious), missed=len(truth) - len(used_truth),
                      extra=len(predicted) - len(used_predictions))


class GroundTruthWriter:
    """Appends one JSON line per frame and flushes it, so a reader sees every frame produced so far.

    Appends rather than truncates: each source run has its own epoch, so runs never collide.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.path.open("a", encoding="utf-8")

    def write(self, frame_id: FrameId, boxes: Iterable[TruthBox]) -> None:
        record = {"stream": frame_id.stream, "epoch": frame_id.epoch, "index": frame_id.index,
                  "boxes": [box.as_json() for box in boxes]}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> GroundTruthWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_ground_truth(path: str | Path) -> Iterator[tuple[FrameId, tuple[TruthBox, ...]]]:
    """The records of a ground-truth file in file order."""
    with Path(path).open(encoding="utf-8") as lines:
        for line in lines:
            if not line.endswith("\n"):  # the writer is in the middle of this line, or died there
                break
            record = json.loads(line)
            frame_id = FrameId(record["stream"], record["epoch"], record["index"])
            yield frame_id, tuple(TruthBox(**box) for box in record["boxes"])
