"""Placement epochs: the `Pinboard-Epoch` a forward carries, recorded per held instance, quoted
back on release, tag and schedule, and compared to fence off stale forwards. Pure.

The spec promises only "a decimal string": an epoch is kept as the exact string received (the
registry compares it byte for byte) and ordered numerically by its significant digits, never
converted (Python would convert, but refuses past 4300 digits: a hostile header must not raise).
"""

from __future__ import annotations


def parse(value: str) -> str | None:
    """A non-empty run of ASCII digits, or `None` (answered 400 `malformed placement epoch`)."""
    if value and value.isascii() and value.isdigit():
        return value
    return None


def order(epoch: str) -> tuple[int, str]:
    """A key that sorts epochs numerically: `order(a) < order(b)` exactly when a < b."""
    significant = epoch.lstrip("0")
    return (len(significant), significant)
