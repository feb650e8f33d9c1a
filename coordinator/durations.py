"""Durations as people write them in commands and settings (a number and a unit), and as the command
line and the console show them."""

from __future__ import annotations

import re

from coordinator.exceptions import InvalidArgumentError

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)\s*$")


def parse_duration(text: str) -> float:
    """Seconds in a duration written as a number and a unit (``ms``, ``s``, ``m``, ``h``, ``d``), as
    ``--older-than`` and the ``[storage]`` setting ``retry_timeout`` take it.

    Raises :class:`~coordinator.exceptions.InvalidArgumentError` if it is not one.

    Example::

        parse_duration("10m")    # 600.0
        parse_duration("500ms")  # 0.5
    """
    matched = _DURATION.match(str(text))
    if matched is None:
        raise InvalidArgumentError(f"not a duration: {text!r} (a number and a unit: 500ms, 90s, 10m, 2h, 1d)")
    return float(matched.group(1)) * _UNITS[matched.group(2)]


def format_duration(seconds: float) -> str:
    """A duration for people, as ``txcoord`` commands and the console's pages show it.

    Example::

        format_duration(0.85)   # '850 ms'
        format_duration(12.34)  # '12.3 s'
        format_duration(245)    # '4 min 05 s'
        format_duration(12000)  # '3 h 20 min'
    """
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"
