"""JPEG decode and encode for the stages that touch pixels (resize, infer, sink).

Decoding is strict: a frame that is empty, truncated, not a JPEG or not the size its header claims
raises :class:`CorruptFrame`, and one whose decoding would not fit the frame pixel limit
raises :class:`OverPixelBudget`, before any large buffer is allocated (:mod:`streamapp.jpeg`
reads the markers first).
"""

from __future__ import annotations

import numpy as np

from streamapp import opencv
from streamapp.errors import one_line
from streamapp.jpeg import CorruptFrame, OverPixelBudget, check_decode_cost, check_jpeg, jpeg_size
from streamapp.opencv import cv2
from streamapp.wire import Frame

__all__ = ["AS_STORED", "UNUSABLE_PIXELS", "CorruptFrame", "OverPixelBudget", "decode_frame", "decode_jpeg",
           "encode_jpeg", "jpeg_size"]

# What pixel work on bad input can raise: our own checks, or OpenCV's on what slips past them.
UNUSABLE_PIXELS = (CorruptFrame, cv2.error)
# Pixels as stored: an EXIF orientation would turn the image after its size was checked.
AS_STORED = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION


def decode_jpeg(jpeg: bytes, *, size: tuple[int, int] | None = None, max_pixels: int | None = None) -> np.ndarray:
    """The BGR image of ``jpeg``; with ``size`` (width, height) the JPEG must have exactly that size.

    ``max_pixels`` defaults to the process's limit (STREAMAPP_MAX_FRAME_PIXELS, or what
    STREAMAPP_MEMORY_BUDGET allows, of the settings the worker runs), the one OpenCV enforces too.
    """
    header = check_jpeg(jpeg, size)
    check_decode_cost(jpeg, header, opencv.pixel_limit() if max_pixels is None else max_pixels)
    try:
        image = cv2.imdecode(np.frombuffer(jpeg, dtype=np.uint8), AS_STORED)
    except cv2.error as exc:  # its own limits, on what slipped past ours
        raise CorruptFrame(f"JPEG data cannot be decoded: {one_line(exc)}") from None
    if image is None:
        raise CorruptFrame("JPEG data cannot be decoded")
    return image


def decode_frame(frame: Frame, max_pixels: int | None = None) -> np.ndarray:
    """The BGR image of a frame, checked against the width and height in its header."""
    return decode_jpeg(frame.jpeg, size=(frame.width, frame.height), max_pixels=max_pixels)


def encode_jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    if not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality must be 1..100, got {quality}")
    ok, buffer = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f"cannot encode a {image.shape} {image.dtype} image as JPEG")
    return buffer.tobytes()
