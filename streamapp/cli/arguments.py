"""Argument types shared by every ``streamapp`` subcommand: each validates and says what is wrong."""

from __future__ import annotations

import argparse
import math

from streamapp.settings import Settings, SettingsError, parse_resolution, parse_stages
from streamapp.units import UnitError, parse_bytes


def size_arg(text: str) -> int:
    """An argparse ``type`` for byte sizes written as in settings: ``16MiB``, ``17MB``, ``1048576``."""
    try:
        return parse_bytes(text, name="size")
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def stages_arg(text: str) -> tuple[str, ...]:
    """A stage set as ``STREAMAPP_STAGES`` takes it: ``join``, ``resize,infer``, ``all``."""
    try:
        return Settings(stages=parse_stages(text, "--stages")).stages
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def resolution_arg(text: str) -> tuple[int, int]:
    try:
        return parse_resolution(text, "--size")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


MAX_FPS = 1000


def fps_arg(text: str) -> float:
    """Frames (or pairs) per second; 0 means as fast as possible."""
    value = _finite(text)
    if not 0 <= value <= MAX_FPS:
        raise argparse.ArgumentTypeError(f"expected 0 (as fast as possible) to {MAX_FPS} per second, got {text}")
    return value


def steady_fps_arg(text: str) -> float:
    """Frames per second for a command whose point is a steady pace: 0 is refused."""
    value = fps_arg(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a steady rate above 0 per second, got 0")
    return value


MAX_PAIR_RATE = 100_000


def rates_arg(text: str) -> tuple[float, ...]:
    """Rising rates per second, comma-separated: ``150,300,600``."""
    rates: list[float] = []
    for part in text.split(","):
        value = _finite(part.strip())
        if not 0 < value <= MAX_PAIR_RATE:
            raise argparse.ArgumentTypeError(
                f"expected rates above 0 and up to {MAX_PAIR_RATE} per second, got {part.strip()}")
        if rates and value <= rates[-1]:
            raise argparse.ArgumentTypeError(f"expected rising rates, got {part.strip()} after {rates[-1]:g}")
        rates.append(value)
    return tuple(rates)


def seconds_arg(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text}")
    return value


def count_arg(text: str) -> int:
    return _whole(text, lowest=1)


def count_or_zero_arg(text: str) -> int:
    return _whole(text, lowest=0)


def port_arg(text: str) -> int:
    return _whole(text, lowest=1, highest=65535)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _whole(text: str, *, lowest: int, highest: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < lowest:
        raise argparse.ArgumentTypeError(f"expected at least {lowest}, got {value}")
    if highest is not None and value > highest:
        raise argparse.ArgumentTypeError(f"expected at most {highest}, got {value}")
    return value
