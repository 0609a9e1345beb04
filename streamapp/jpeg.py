"""JPEG checks that read only the markers, never the pixels: cheap enough for every frame at the
join, and free of OpenCV, so a worker that only joins never loads it.

libjpeg happily "decodes" a truncated file into an image padded with grey, so the end-of-image
marker is checked up front, with the size the start-of-frame header claims.
"""

from __future__ import annotations

from streamapp.errors import StreamappError

_START = b"\xff\xd8"
_END = b"\xff\xd9"
# Start-of-frame markers (baseline, progressive, lossless, arithmetic...): all but DHT, JPG, DAC.
_START_OF_FRAME = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers that stand alone, without a length field.
_STANDALONE = frozenset(range(0xD0, 0xD9)) | {0x01}


class CorruptFrame(StreamappError, ValueError):
    """JPEG bytes that cannot be decoded into the image they claim to be."""


def jpeg_size(jpeg: bytes) -> tuple[int, int]:
    """(width, height) from the JPEG's start-of-frame header, without decoding any pixels."""
    if jpeg[:2] != _START:  # slices, not startswith/endswith: a memoryview of a record reads the same
        raise CorruptFrame("not a JPEG: no start-of-image marker")
    position = 2
    while position + 4 <= len(jpeg):
        if jpeg[position] != 0xFF:
            raise CorruptFrame(f"JPEG marker expected at byte {position}")
        marker = jpeg[position + 1]
        if marker == 0xFF:  # fill byte before a marker
            position += 1
            continue
        if marker in _STANDALONE:
            position += 2
            continue
        if marker in _START_OF_FRAME and position + 9 <= len(jpeg):
            height = int.from_bytes(jpeg[position + 5:position + 7], "big")
            width = int.from_bytes(jpeg[position + 7:position + 9], "big")
            if width == 0 or height == 0:
                raise CorruptFrame(f"JPEG claims an empty image of {width}x{height}")
            return width, height
        if marker == 0xDA:  # start of scan: the pixel data began without a frame header
            break
        position += 2 + int.from_bytes(jpeg[position + 2:position + 4], "big")
    raise CorruptFrame("JPEG has no start-of-frame header")


def check_jpeg(jpeg: bytes, size: tuple[int, int] | None = None) -> None:
    """Raise :class:`CorruptFrame` unless ``jpeg`` has a frame header (of ``size``, width and
    height, when given) and its end-of-image marker."""
    actual = jpeg_size(jpeg)
    if size is not None and actual != tuple(size):
        raise CorruptFrame(f"JPEG is {actual[0]}x{actual[1]}, the frame says {size[0]}x{size[1]}")
    if jpeg[-2:] != _END:
        raise CorruptFrame("JPEG is truncated: no end-of-image marker")
