"""What every command of the ``idemcrawl`` command line shares: flag value types, usage errors.

The crawler's commands (``cli``) and the lab's (``lab.commands``) both parse numbers and report
a bad request the same way; this leaf module lets them without the lab importing the CLI.
"""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """A problem with what the user asked for; the command line prints it as one line."""


def count(text: str) -> int:
    """A whole number >= 0 (each flag says what 0 means)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def positive(text: str) -> int:
    """A whole number >= 1 (sizes for which 0 would be nonsense: listings, products per page)."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    """Like :func:`count`, for numbers that are not counts (ports, cursors, hops)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def seconds(text: str) -> float:
    """A duration: a finite-or-infinite number >= 0 (NaN refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative number")
    return value
