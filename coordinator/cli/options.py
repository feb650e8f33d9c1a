"""What the ``txcoord`` commands share: exit codes, the common options, argument checks."""

from __future__ import annotations

import argparse

__all__ = ["EXIT_FAILED", "EXIT_OK", "at_least", "common_options"]

EXIT_OK = 0
EXIT_FAILED = 1


def common_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    command.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def at_least(minimum: int, text: str, why: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}" + (f" ({why})" if why else "") + f", got {value}")
    return value
