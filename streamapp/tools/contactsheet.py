"""Contact sheets: a grid of a run's annotated frames in one PNG (``streamapp demo`` writes one)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from streamapp.imaging import AS_STORED, CorruptFrame
from streamapp.opencv import cv2


def contact_sheet(image_paths: Sequence[str | Path], columns: int = 4, tile_width: int = 320) -> np.ndarray:
    """The images as tiles of ``tile_width`` in a grid, left to right, top to bottom.

    Tiles take the aspect ratio of the first image; others keep theirs, centred on black.
    Images are read one at a time.
    """
    if not image_paths:
        raise ValueError("a contact sheet needs at least one image")
    if columns < 1 or tile_width < 1:
        raise ValueError(f"columns and tile_width must be >= 1, got {columns} and {tile_width}")
    sheet: np.ndarray | None = None
    tile_height = 0
    rows = math.ceil(len(image_paths) / columns)
    for position, path in enumerate(image_paths):
        image = _read_image(path)
        if sheet is None:
            tile_height = max(1, round(tile_width * image.shape[0] / image.shape[1]))
            sheet = np.zeros((rows * tile_height, columns * tile_width, 3), np.uint8)
        row, column = divmod(position, columns)
        scale = min(tile_width / image.shape[1], tile_height / image.shape[0])
        width, height = max(1, round(image.shape[1] * scale)), max(1, round(image.shape[0] * scale))
        top = row * tile_height + (tile_height - height) // 2
        left = column * tile_width + (tile_width - width) // 2
        sheet[top:top + height, left:left + width] = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    assert sheet is not None  # image_paths is not empty
    return sheet


def _read_image(path: str | Path) -> np.ndarray:
    image = cv2.imread(str(path), AS_STORED)
    if image is None:
        raise CorruptFrame(f"cannot read image {str(path)!r}")
    return image


def save_contact_sheet(path: str | Path, image_paths: Sequence[str | Path], columns: int = 4,
                       tile_width: int = 320) -> Path:
    """Writes :func:`contact_sheet` as a PNG (``contact_sheet.png`` by convention)."""
    path = Path(path)
    ok, png = cv2.imencode(".png", contact_sheet(image_paths, columns, tile_width))
    if not ok:
        raise OSError(f"cannot encode contact sheet {path}")
    path.write_bytes(png.tobytes())
    return path
