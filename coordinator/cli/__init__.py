"""The ``txcoord`` command line: :mod:`.commands` parses and runs the commands, one module per group of them
(each with a ``register(commands)``), :mod:`.output` prints their results."""

from coordinator.cli.commands import main

__all__ = ["main"]
