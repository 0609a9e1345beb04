"""OpenCV, loaded with its own decoder limit set to the frame pixel limit of the settings in use.

OpenCV reads ``OPENCV_IO_MAX_IMAGE_PIXELS`` once, when ``cv2`` loads. So ``cv2`` loads on its first
use, not when this module is imported: a worker names its limit before (:func:`use_pixel_limit`,
from the Settings handed to create_app), and the project reaches ``cv2`` only through this module
(tests/unit/test_pixel_budget.py checks both). A process that names none has the default settings'
limit. Our own check (streamapp.imaging) refuses an oversized frame first, with a reason; OpenCV's
limit is the same number, for what slips past it.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from streamapp.settings import Settings

if TYPE_CHECKING:
    import cv2

__all__ = ["cv2", "pixel_limit", "use_pixel_limit"]

_pixel_limit = Settings().frame_pixel_limit


def use_pixel_limit(pixels: int) -> None:
    """Frames of at most ``pixels`` are decoded in this process: our own check's limit at once,
    and OpenCV's when cv2 loads (a worker names it first; OpenCV keeps the limit it loaded with)."""
    global _pixel_limit
    _pixel_limit = pixels


def pixel_limit() -> int:
    """Pixels of the largest frame this process decodes."""
    return _pixel_limit


def __getattr__(name: str) -> Any:
    """``cv2``, loaded on first use under this process's limit."""
    if name != "cv2":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    limit = pixel_limit()
    os.environ["OPENCV_IO_MAX_IMAGE_PIXELS"] = str(limit)
    module = importlib.import_module("cv2")
    globals()["cv2"] = module
    return module
