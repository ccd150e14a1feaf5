"""Argument types shared by the command-line scripts: a bad number is a usage error that
names the flag (``argparse`` exits with status 2), not a traceback after minutes of work."""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_float", "positive_int"]


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer > 0."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be an integer > 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An ``argparse`` type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value
