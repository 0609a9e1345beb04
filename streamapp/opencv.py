"""OpenCV, imported with its own decoder limit set to this process's frame pixel limit.

OpenCV reads ``OPENCV_IO_MAX_IMAGE_PIXELS`` once, when ``cv2`` is first imported, so the
variable is set here before that import, and the project imports ``cv2`` only from here
(tests/unit/test_pixel_budget.py checks both). Our own check (streamapp.imaging) refuses an
oversized frame first, with a reason; OpenCV's limit is the same number, for what slips past it.
"""

from __future__ import annotations

import os

from streamapp.settings import Settings, SettingsError


def _pixel_limit() -> int:
    try:
        return Settings.from_env().frame_pixel_limit
    except SettingsError:  # reported, with its exit code, by whatever reads the settings next
        return Settings().frame_pixel_limit


PIXEL_LIMIT = _pixel_limit()
os.environ["OPENCV_IO_MAX_IMAGE_PIXELS"] = str(PIXEL_LIMIT)

import cv2  # noqa: E402  - after the variable, which it reads when it loads

__all__ = ["PIXEL_LIMIT", "cv2"]
