"""Argument types shared by every ``streamapp`` subcommand: each validates and says what is wrong."""

from __future__ import annotations

import argparse

from streamapp.settings import parse_resolution
from streamapp.units import UnitError, parse_bytes


def size_arg(text: str) -> int:
    """An argparse ``type`` for byte sizes written as in settings: ``16MiB``, ``17MB``, ``1048576``."""
    try:
        return parse_bytes(text, name="size")
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def resolution_arg(text: str) -> tuple[int, int]:
    try:
        return parse_resolution(text, "--size")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fps_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fps must be a number, got {text!r}") from None
    if not (0 <= value <= 1000):
        raise argparse.ArgumentTypeError("--fps must be between 0 (as fast as possible) and 1000")
    return value


def count_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value
