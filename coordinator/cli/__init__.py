"""The ``txcoord`` command line: :mod:`.commands` runs the commands, :mod:`.output` prints their results."""

from coordinator.cli.commands import main

__all__ = ["main"]
