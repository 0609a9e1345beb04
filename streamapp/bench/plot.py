"""Line charts of the soak samples, drawn with OpenCV (already a dependency): value over time,
one line per series, dashed horizontal lines for limits."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import cv2
import numpy as np

WIDTH, HEIGHT = 960, 480
LEFT, RIGHT, TOP, BOTTOM = 90, 20, 50, 50
COLOURS = [(200, 90, 30), (40, 40, 220), (40, 160, 40), (160, 60, 160), (30, 150, 200), (90, 90, 90)]
FONT = cv2.FONT_HERSHEY_SIMPLEX
MIB = 1024**2

Series = Sequence[tuple[float, float]]


def line_chart(path: Path, title: str, series: Mapping[str, Series],
               limits: Mapping[str, float] | None = None, unit: str = "MiB", scale: float = MIB) -> None:
    limits = limits or {}
    image = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    points = [point for values in series.values() for point in values]
    x_max = max([x for x, _ in points] + [1.0])
    y_max = max([y for _, y in points] + list(limits.values()) + [1.0]) * 1.08

    def to_pixel(x: float, y: float) -> tuple[int, int]:
        return (int(LEFT + x / x_max * (WIDTH - LEFT - RIGHT)),
                int(HEIGHT - BOTTOM - y / y_max * (HEIGHT - TOP - BOTTOM)))

    _axes(image, x_max, y_max, unit, scale, to_pixel)
    cv2.putText(image, title, (LEFT, 30), FONT, 0.7, (0, 0, 0), 2, cv2.LINE_AA)
    legend = 0
    for number, (name, values) in enumerate(series.items()):
        colour = COLOURS[number % len(COLOURS)]
        if len(values) > 1:
            line = np.array([to_pixel(x, y) for x, y in values], np.int32)
            cv2.polylines(image, [line], False, colour, 2, cv2.LINE_AA)
        legend = _legend(image, legend, name, colour)
    for number, (name, value) in enumerate(limits.items()):
        colour = COLOURS[(len(series) + number) % len(COLOURS)]
        _dashed(image, to_pixel(0, value), to_pixel(x_max, value), colour)
        legend = _legend(image, legend, f"{name} ({value / scale:.0f} {unit})", colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), image)


def _axes(image, x_max, y_max, unit, scale, to_pixel) -> None:
    grey = (200, 200, 200)
    for step in range(6):
        y = y_max * step / 5
        left, right = to_pixel(0, y), to_pixel(x_max, y)
        cv2.line(image, left, right, grey, 1)
        cv2.putText(image, f"{y / scale:.0f}", (8, left[1] + 5), FONT, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
        x = x_max * step / 5
        bottom = to_pixel(x, 0)
        cv2.putText(image, f"{x:.0f}s", (bottom[0] - 12, HEIGHT - BOTTOM + 20), FONT, 0.45, (0, 0, 0), 1,
                    cv2.LINE_AA)
    cv2.putText(image, unit, (8, TOP - 8), FONT, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.rectangle(image, to_pixel(0, y_max), to_pixel(x_max, 0), (0, 0, 0), 1)


def _legend(image, row: int, text: str, colour) -> int:
    y = TOP + 18 + row * 20
    cv2.line(image, (LEFT + 10, y - 4), (LEFT + 35, y - 4), colour, 3)
    cv2.putText(image, text, (LEFT + 42, y), FONT, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return row + 1


def _dashed(image, start, end, colour, dash: int = 10) -> None:
    for x in range(start[0], end[0], 2 * dash):
        cv2.line(image, (x, start[1]), (min(x + dash, end[0]), end[1]), colour, 1)
