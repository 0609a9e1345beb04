"""Crafted JPEGs: what a hostile producer can send in a frame, built from the markers up, never
by encoding the pixels they claim (a 16384x16384 image would take the test 768 MiB).

Shared by the unit tests of the header reader and the stages, and the bomb test on the broker.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from streamapp.imaging import encode_jpeg
from streamapp.jpeg import CorruptFrame, OverPixelBudget
from streamapp.opencv import cv2

_SOS = b"\xff\xda"
_EOI = b"\xff\xd9"


def _split(jpeg: bytes) -> tuple[bytes, bytes]:
    """(everything up to the first scan's data, the scans and EOI after it)."""
    start = jpeg.index(_SOS)
    header_end = start + 2 + int.from_bytes(jpeg[start + 2:start + 4], "big")
    return jpeg[:header_end], jpeg[header_end:]


def with_size(jpeg: bytes, width: int, height: int) -> bytes:
    """``jpeg`` with its start-of-frame header claiming ``width`` x ``height``, its data as it was."""
    sof = next(i for i in range(2, len(jpeg) - 9) if jpeg[i] == 0xFF and jpeg[i + 1] in (0xC0, 0xC1, 0xC2))
    return jpeg[:sof + 5] + struct.pack(">HH", height, width) + jpeg[sof + 9:]


@functools.cache
def flat_grey(width: int, height: int) -> bytes:
    """A whole, valid baseline JPEG of a flat grey (128) image of ``width`` x ``height`` (multiples
    of 16): every block of such an image is coded the same (no DC change, no AC), and with 4:2:0
    one 16x16 unit is 32 bits, so its data is one unit's 4 bytes repeated (16384x16384: 4 MiB)."""
    assert width % 16 == 0 and height % 16 == 0
    small = encode_jpeg(np.full((32, 32, 3), 128, np.uint8), 90)
    header, data = _split(small)
    unit, rest = data[:4], data[4:]
    assert rest == unit * 3 + _EOI, "OpenCV no longer codes a flat grey unit in 4 bytes"
    return with_size(header, width, height) + unit * (width // 16 * height // 16) + _EOI


@functools.cache
def progressive(width: int = 64, height: int = 48) -> bytes:
    image = np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8)
    ok, buffer = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert ok
    return buffer.tobytes()


def one_scan_progressive() -> bytes:
    """A small progressive JPEG cut after its first scan: one scan, yet libjpeg buffers every
    coefficient, as for all progressive JPEGs."""
    header, data = _split(progressive())
    return header + data[:data.index(_SOS)] + _EOI


def non_interleaved() -> bytes:
    """A small baseline JPEG whose first scan names only its first component (its data is the
    interleaved one's, which nothing decodes before the budget refuses it)."""
    header, data = _split(encode_jpeg(np.full((48, 64, 3), 90, np.uint8), 90))
    sos = header.index(_SOS)
    selector, spectral = header[sos + 5:sos + 7], header[-3:]
    return header[:sos] + _SOS + struct.pack(">HB", 8, 1) + selector + spectral + data


def many_scans(scans: int) -> bytes:
    """A small progressive JPEG whose scans are repeated until it has ``scans`` of them."""
    header, data = _split(progressive())
    first_scan = header[header.index(_SOS):]
    body = first_scan + data[:-2]  # every scan, as the original has them
    repeats = -(-scans // body.count(_SOS))
    return header[:header.index(_SOS)] + body * repeats + _EOI


def with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """``jpeg`` with an EXIF segment (APP1) after its start-of-image marker that tells viewers to
    turn it: 6 is a quarter turn clockwise, so a 3072x1024 image shows as 1024x3072."""
    entry = struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0)  # Orientation, one SHORT
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1) + entry + struct.pack(">I", 0)
    exif = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", 2 + len(exif)) + exif + jpeg[2:]


def corpus(max_pixels: int) -> dict[str, tuple[bytes, type[CorruptFrame]]]:
    """Crafted frames that must be refused before they are decoded, each with the error that
    refuses it, for a process whose frame pixel limit is ``max_pixels``."""
    small = encode_jpeg(np.full((48, 64, 3), 90, np.uint8), 90)
    over = int((max_pixels * 2) ** 0.5) // 16 * 16
    # Several scans hold every component's coefficients too: 12 bytes a pixel instead of 6.
    side = int((max_pixels * 3 / 4) ** 0.5) // 16 * 16
    return {
        "flat grey 16384x16384": (flat_grey(16384, 16384), OverPixelBudget),
        "twice the limit, its data cut short": (with_size(small, over, over), OverPixelBudget),
        "largest size a header can claim": (with_size(small, 65535, 65535), OverPixelBudget),
        "progressive, pixels within the limit, coefficients not": (with_size(progressive(), side, side),
                                                                   OverPixelBudget),
        "progressive cut to one scan, pixels within the limit, coefficients not": (
            with_size(one_scan_progressive(), side, side), OverPixelBudget),
        "non-interleaved first scan, pixels within the limit, coefficients not": (
            with_size(non_interleaved(), side, side), OverPixelBudget),
        "500 progressive scans": (many_scans(500), OverPixelBudget),
        "no end-of-image marker": (small[:len(small) // 2], CorruptFrame),
        "cut inside the frame header": (small[:small.index(b"\xff\xc0") + 7], CorruptFrame),
        "empty height (a DNL marker's)": (with_size(small, 64, 0), CorruptFrame),
        "segment length past the end": (small[:2] + b"\xff\xe0\xff\xff" + small[2:], CorruptFrame),
    }
