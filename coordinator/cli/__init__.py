"""The ``txcoord`` command line: :mod:`.console` runs the commands, :mod:`.output` prints their results."""

from coordinator.cli.console import main

__all__ = ["main"]
