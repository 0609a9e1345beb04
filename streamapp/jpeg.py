"""JPEG checks that read only the markers, never the pixels: cheap enough for every frame at the
join, and free of OpenCV, so a worker that only joins never loads it.

libjpeg happily "decodes" a truncated file into an image padded with grey, so the end-of-image
marker is checked up front, with the size the start-of-frame header claims. The same header says
what decoding would cost (:meth:`JpegHeader.decode_bytes`, with the number of scans), so a frame
whose pixels would not fit the worker's budget is refused before anything allocates them
(:func:`check_decode_cost`; only the stages that decode count the scans, never the join).
"""

from __future__ import annotations

import dataclasses
import re

from streamapp.errors import StreamappError
from streamapp.units import format_bytes

_START = b"\xff\xd8"
_END = b"\xff\xd9"
# Start-of-frame markers (baseline, progressive, lossless, arithmetic...): all but DHT, JPG, DAC.
_START_OF_FRAME = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Those of progressive JPEGs (Huffman or arithmetic, sequential or hierarchical).
_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
# Markers that stand alone, without a length field.
_STANDALONE = frozenset(range(0xD0, 0xD9)) | {0x01}
# A start-of-scan marker. Entropy-coded data escapes every 0xFF (0xFF00), so outside metadata
# segments these two bytes are only ever a scan's start; inside one they count a scan too many,
# which errs on the side of refusing.
_START_OF_SCAN = re.compile(b"\xff\xda")
# Scans a frame may have: encoders write 1 (baseline) to about 10 (progressive); every scan of a
# progressive JPEG is another pass over all of its coefficients.
MAX_SCANS = 100
# Bytes a decode takes per pixel: the BGR image (3), and as much again that OpenCV's decoder holds
# beside it until it returns (measured: docs/benchmarks.md, Measurements).
DECODE_BYTES_PER_PIXEL = 6
# Bytes per sample of a component's DCT coefficients, which libjpeg keeps for the whole image
# until the last scan when a JPEG may have more than one (JpegHeader.buffers_coefficients).
_COEFFICIENT_BYTES = 2


class CorruptFrame(StreamappError, ValueError):
    """JPEG bytes that cannot be decoded into the image they claim to be."""


class OverPixelBudget(CorruptFrame):
    """A JPEG whose decoding would take more memory than one frame may."""


@dataclasses.dataclass(frozen=True)
class JpegHeader:
    """What a JPEG's markers say about its image."""

    width: int
    height: int
    components: int  # 1 grey, 3 YCbCr, 4 CMYK
    progressive: bool = False

    def decode_bytes(self, scans: int, first_scan_components: int) -> int:
        """Memory a decode of a JPEG of ``scans`` scans takes: the image and OpenCV's copy, and
        when libjpeg buffers the whole image's coefficients, every component's (counted at full
        resolution, an upper bound when chroma is subsampled)."""
        pixels = self.width * self.height
        coefficients = self.components * _COEFFICIENT_BYTES * pixels \
            if self.buffers_coefficients(scans, first_scan_components) else 0
        return DECODE_BYTES_PER_PIXEL * pixels + coefficients

    def buffers_coefficients(self, scans: int, first_scan_components: int) -> bool:
        """Whether libjpeg keeps the whole image's coefficients: it decides so from the frame and
        its first scan, before it reads a second (progressive, or a first scan without every
        component), whatever the scans that follow; more than one scan is counted the same."""
        return self.progressive or first_scan_components < self.components or scans > 1


def read_header(jpeg: bytes) -> JpegHeader:
    """The JPEG's start-of-frame header, without decoding any pixels.

    Raises :class:`CorruptFrame` and nothing else, whatever the bytes; reads none past them.
    """
    if len(jpeg) < 2 or jpeg[:2] != _START:  # a slice, not startswith: a memoryview reads the same
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
        if marker in _START_OF_FRAME and position + 10 <= len(jpeg):
            height = int.from_bytes(jpeg[position + 5:position + 7], "big")
            width = int.from_bytes(jpeg[position + 7:position + 9], "big")
            if width == 0 or height == 0:
                raise CorruptFrame(f"JPEG claims an empty image of {width}x{height}")
            return JpegHeader(width, height, jpeg[position + 9], marker in _PROGRESSIVE)
        if marker == 0xDA:  # start of scan: the pixel data began without a frame header
            break
        position += 2 + int.from_bytes(jpeg[position + 2:position + 4], "big")
    raise CorruptFrame("JPEG has no start-of-frame header")


def count_scans(jpeg: bytes) -> int:
    """Start-of-scan markers in ``jpeg`` (a pass over all of its bytes)."""
    return sum(1 for _ in _START_OF_SCAN.finditer(jpeg))


def first_scan_components(jpeg: bytes) -> int:
    """Components the first start-of-scan header names (0 if ``jpeg`` ends before it says)."""
    scan = _START_OF_SCAN.search(jpeg)  # a pass over the bytes up to it only
    return jpeg[scan.start() + 4] if scan is not None and scan.start() + 4 < len(jpeg) else 0


def jpeg_size(jpeg: bytes) -> tuple[int, int]:
    """(width, height) from the JPEG's start-of-frame header, without decoding any pixels."""
    header = read_header(jpeg)
    return header.width, header.height


def check_jpeg(jpeg: bytes, size: tuple[int, int] | None = None) -> JpegHeader:
    """The JPEG's header; raises :class:`CorruptFrame` unless ``jpeg`` has a frame header (of
    ``size``, width and height, when given) and its end-of-image marker."""
    header = read_header(jpeg)
    if size is not None and (header.width, header.height) != tuple(size):
        raise CorruptFrame(f"JPEG is {header.width}x{header.height}, the frame says {size[0]}x{size[1]}")
    if jpeg[-2:] != _END:
        raise CorruptFrame("JPEG is truncated: no end-of-image marker")
    return header


def check_decode_cost(jpeg: bytes, header: JpegHeader, max_pixels: int) -> None:
    """Raise :class:`OverPixelBudget` unless decoding ``jpeg`` (whose header is ``header``) fits
    the memory of a frame of ``max_pixels`` pixels, and its scans are few enough to decode in
    reasonable time."""
    scans = count_scans(jpeg)
    if scans > MAX_SCANS:
        raise OverPixelBudget(f"JPEG has {scans} scans, over the {MAX_SCANS} a frame may have")
    cost, allowed = header.decode_bytes(scans, first_scan_components(jpeg)), DECODE_BYTES_PER_PIXEL * max_pixels
    if cost > allowed:
        many = f", {scans} scans" if scans > 1 else ", progressive" if header.progressive else ""
        raise OverPixelBudget(
            f"JPEG of {header.width}x{header.height}{many} takes {format_bytes(cost)} to decode, over "
            f"the {format_bytes(allowed)} of a frame of {max_pixels} pixels",
            "lower the frame's resolution, or raise STREAMAPP_MEMORY_BUDGET (the budget is a "
            "sixteenth of it) or STREAMAPP_MAX_FRAME_PIXELS")
