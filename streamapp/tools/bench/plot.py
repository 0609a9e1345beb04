"""Charts of the benchmarks, drawn with OpenCV (already a dependency): line charts (value over
time or over rate, one line per series, dashed horizontal lines for limits) and grouped bars."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from streamapp.opencv import cv2

WIDTH, HEIGHT = 960, 480
LEFT, RIGHT, TOP, BOTTOM = 90, 20, 50, 50
COLOURS = [(200, 90, 30), (40, 40, 220), (40, 160, 40), (160, 60, 160), (30, 150, 200), (90, 90, 90)]
FONT = cv2.FONT_HERSHEY_SIMPLEX
MIB = 1024**2

Series = Sequence[tuple[float, float]]


def line_chart(path: Path, title: str, series: Mapping[str, Series],
               limits: Mapping[str, float] | None = None, unit: str = "MiB", scale: float = MIB) -> None:
    write_png(path, line_image(title, series, limits, unit, scale))


def line_image(title: str, series: Mapping[str, Series], limits: Mapping[str, float] | None = None,
               unit: str = "MiB", scale: float = MIB, x_unit: str = "s", markers: bool = False) -> np.ndarray:
    limits = limits or {}
    image = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    points = [point for values in series.values() for point in values]
    x_max = max([x for x, _ in points] + [1.0])
    y_max = max([y for _, y in points] + list(limits.values()) + [1.0]) * 1.08

    def to_pixel(x: float, y: float) -> tuple[int, int]:
        return (int(LEFT + x / x_max * (WIDTH - LEFT - RIGHT)),
                int(HEIGHT - BOTTOM - y / y_max * (HEIGHT - TOP - BOTTOM)))

    _axes(image, x_max, y_max, unit, scale, to_pixel, x_unit)
    cv2.putText(image, title, (LEFT, 30), FONT, 0.7, (0, 0, 0), 2, cv2.LINE_AA)
    legend = 0
    for number, (name, values) in enumerate(series.items()):
        colour = COLOURS[number % len(COLOURS)]
        if len(values) > 1:
            line = np.array([to_pixel(x, y) for x, y in values], np.int32)
            cv2.polylines(image, [line], False, colour, 2, cv2.LINE_AA)
        for x, y in values if markers else ():
            cv2.circle(image, to_pixel(x, y), 3, colour, -1, cv2.LINE_AA)
        legend = _legend(image, legend, name, colour)
    for number, (name, value) in enumerate(limits.items()):
        colour = COLOURS[(len(series) + number) % len(COLOURS)]
        _dashed(image, to_pixel(0, value), to_pixel(x_max, value), colour)
        legend = _legend(image, legend, f"{name} ({value / scale:.0f} {unit})", colour)
    return image


def bar_image(title: str, groups: Mapping[str, Mapping[str, float]], unit: str) -> np.ndarray:
    """One group of bars per key of ``groups`` (e.g. a phase), one bar per series in it (e.g. a
    system), each labelled with its value; series keep one colour across groups."""
    image = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    names = list(dict.fromkeys(name for bars in groups.values() for name in bars))
    y_max = max([value for bars in groups.values() for value in bars.values()] + [1.0]) * 1.15
    plot_width = WIDTH - LEFT - RIGHT
    group_width = plot_width / max(1, len(groups))
    bar_width = group_width * 0.8 / max(1, len(names))
    base = HEIGHT - BOTTOM
    cv2.putText(image, title, (LEFT, 30), FONT, 0.7, (0, 0, 0), 2, cv2.LINE_AA)
    cv2.putText(image, unit, (8, TOP - 8), FONT, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.line(image, (LEFT, base), (WIDTH - RIGHT, base), (0, 0, 0), 1)
    for number, (group, bars) in enumerate(groups.items()):
        left = LEFT + number * group_width + group_width * 0.1
        cv2.putText(image, group, (int(left), base + 20), FONT, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
        for name, value in bars.items():
            x = int(left + names.index(name) * bar_width)
            top = int(base - value / y_max * (base - TOP - 20))
            colour = COLOURS[names.index(name) % len(COLOURS)]
            cv2.rectangle(image, (x, top), (int(x + bar_width) - 4, base), colour, -1)
            cv2.putText(image, f"{value:.0f}", (x, top - 6), FONT, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    legend = 0
    for number, name in enumerate(names):
        legend = _legend_right(image, legend, name, COLOURS[number % len(COLOURS)])
    return image


def write_png(path: Path, *images: np.ndarray) -> None:
    """The images one above the other in one PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.vstack(images))


def _axes(image, x_max, y_max, unit, scale, to_pixel, x_unit: str = "s") -> None:
    grey = (200, 200, 200)
    for step in range(6):
        y = y_max * step / 5
        left, right = to_pixel(0, y), to_pixel(x_max, y)
        cv2.line(image, left, right, grey, 1)
        cv2.putText(image, f"{y / scale:.0f}", (8, left[1] + 5), FONT, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
        x = x_max * step / 5
        bottom = to_pixel(x, 0)
        cv2.putText(image, f"{x:.0f}{x_unit}", (bottom[0] - 12, HEIGHT - BOTTOM + 20), FONT, 0.45, (0, 0, 0), 1,
                    cv2.LINE_AA)
    cv2.putText(image, unit, (8, TOP - 8), FONT, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.rectangle(image, to_pixel(0, y_max), to_pixel(x_max, 0), (0, 0, 0), 1)


def _legend(image, row: int, text: str, colour) -> int:
    y = TOP + 18 + row * 20
    cv2.line(image, (LEFT + 10, y - 4), (LEFT + 35, y - 4), colour, 3)
    cv2.putText(image, text, (LEFT + 42, y), FONT, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return row + 1


def _legend_right(image, row: int, text: str, colour) -> int:
    y = TOP + 18 + row * 20
    x = WIDTH - RIGHT - 300
    cv2.rectangle(image, (x, y - 10), (x + 20, y), colour, -1)
    cv2.putText(image, text, (x + 28, y), FONT, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return row + 1


def _dashed(image, start, end, colour, dash: int = 10) -> None:
    for x in range(start[0], end[0], 2 * dash):
        cv2.line(image, (x, start[1]), (min(x + dash, end[0]), end[1]), colour, 1)
