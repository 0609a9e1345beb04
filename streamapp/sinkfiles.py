"""Where the sink writes: per stream and run epoch, one frame file per join key and the video in
finished segments (``<out>/<stream>/<epoch>/frames/00000042.jpg``, ``.../video/00000000-00000899.avi``).

Beside the stages, so tools and tests that read the sink's output find it without loading the sink.
"""

from __future__ import annotations

import re
from pathlib import Path

from streamapp.wire import MAX_FRAME_INDEX, FrameId

# A frame index in a name: 8 digits at least, more from 10**8 on, up to the wire's limit.
_INDEX = rf"(\d{{8,{len(str(MAX_FRAME_INDEX))}}})"
SEGMENT_NAME = re.compile(rf"\A{_INDEX}-{_INDEX}\.avi\Z")


def epoch_dir(out_dir: str | Path, stream: str, epoch: int) -> Path:
    if stream in (".", ".."):  # valid stream ids, but they would leave out_dir
        raise ValueError(f"stream id {stream!r} cannot name an output directory")
    return Path(out_dir) / stream / str(epoch)


def frame_path(out_dir: str | Path, frame_id: FrameId) -> Path:
    return epoch_dir(out_dir, frame_id.stream, frame_id.epoch) / "frames" / f"{frame_id.index:08d}.jpg"


def frame_id_of(path: Path) -> FrameId | None:
    """The frame a :func:`frame_path` names; None for any other path."""
    run = path.parent.parent
    if path.parent.name != "frames" or path.suffix != ".jpg" or not (path.stem.isdigit() and run.name.isdigit()):
        return None
    return FrameId(run.parent.name, int(run.name), int(path.stem))


def video_dir(out_dir: str | Path, stream: str, epoch: int) -> Path:
    return epoch_dir(out_dir, stream, epoch) / "video"


def segment_path(directory: Path, first: int, last: int) -> Path:
    return directory / f"{first:08d}-{last:08d}.avi"


def video_segments(out_dir: str | Path, stream: str, epoch: int) -> list[Path]:
    """The finished segments of a run's video, in frame order (by number: names grow a digit
    from frame 10**8 on)."""
    directory = video_dir(out_dir, stream, epoch)
    if not directory.is_dir():
        return []
    return sorted((path for path in directory.iterdir() if SEGMENT_NAME.match(path.name)), key=last_index)


def last_index(segment: Path) -> int:
    match = SEGMENT_NAME.match(segment.name)
    if match is None:
        raise ValueError(f"{segment} is not named like a video segment")
    return int(match.group(2))
