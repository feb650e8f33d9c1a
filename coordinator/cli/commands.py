"""The ``txcoord`` commands (also ``python -m coordinator``): arguments in, exit code out. Each group of
commands is a module of this package with a ``register(commands)`` that adds each command's parser,
beside its handler (:mod:`.startup`, :mod:`.transactions`, :mod:`.administration`, :mod:`.console`,
:mod:`.demo`); what they print is :mod:`coordinator.cli.output`'s.

Subcommands (each reads ``--config``, default ``conf/coordinator.toml``)::

    txcoord init                      # create the lakehouse's system tables (and the config file, if missing)
    txcoord checker [--exit-if-running] [--recover-checkpoint]   # run the checker (needs txcoord[spark])
    txcoord spark-setup [--properties-file | --conf-dir | --job-file JOB] [--no-class-archive]   # Spark's jars and class archive; what spark-submit needs
    txcoord status                    # pending, checks, discards, rejections, the checker and its lag
    txcoord pending [--older-than DURATION] [--group G]   # hanging transactions and what comes next
    txcoord resolve TRANSACTION_ID --commit|--rollback --reason TEXT   # end a hanging transaction by hand
    txcoord inspect TRANSACTION_ID    # one transaction's timeline, from every table
    txcoord maintain [--retention-hours H] [--log-retention-hours H] [--table NAME]   # compact, checkpoint, vacuum
    txcoord demo [--lakehouse DIR] [--orders N] [--object-store S3_URL]   # the order/credits story, end to end
    txcoord conformance --producer COMMAND [--case NAME] [--object-store] [--parallel N]   # a client under test, its cases side by side
    txcoord alert-rules               # the Prometheus alert rules for the checker's metrics (no --config)
    txcoord console [--port N] [--host H] [--users FILE]   # the operators' web console (needs txcoord[console])
    txcoord console-user add|remove|list [NAME] [--role viewer|operator]   # who may sign in to it

``init``, ``status``, ``pending``, ``resolve``, ``inspect`` and ``maintain`` start no JVM; ``txcoord --version``
prints the version. Output is for people; ``--json``
prints one JSON document for scripts instead.

Exit codes: 0 success; 1 the answer is bad news (``status``: no live checker;
``inspect``: no table knows the transaction) or the command failed; 2 bad
arguments or configuration, or no lakehouse where the configuration points.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from coordinator.cli import administration, conformance, console, consumers, demo, startup, transactions
from coordinator.cli.options import EXIT_FAILED, EXIT_OK
from coordinator.config import EXIT_USAGE
from coordinator.exceptions import (AccessDeniedError, ConfigError, LakehouseNotFoundError, OutdatedLakehouseError,
                                    SparkSetupError, StorageUnavailableError)

__all__ = ["EXIT_FAILED", "EXIT_OK", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand: each group of them is a module of this package with a
    ``register(commands)``, in the order ``txcoord --help`` lists them.

    Example::

        build_parser().parse_args(["demo", "--orders", "12"]).orders  # 12
    """
    parser = argparse.ArgumentParser(prog="txcoord", description="Transactional messages on Delta Lake.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    startup.register(commands)
    transactions.register(commands)
    administration.register(commands)
    consumers.register(commands)
    console.register(commands)
    demo.register(commands)
    conformance.register(commands)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Parse ``argv`` and run the subcommand; return the exit code.

    Example::

        main(["init", "--config", "conf/coordinator.toml"])  # 0
    """
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as error:
        print(f"txcoord {args.command}: configuration error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (LakehouseNotFoundError, OutdatedLakehouseError, SparkSetupError) as error:
        print(f"txcoord {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (AccessDeniedError, StorageUnavailableError) as error:  # the storage's answer says it all: no traceback
        print(f"txcoord {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"txcoord {args.command}: interrupted", file=sys.stderr)
        return 130


def _version() -> str:
    from importlib.metadata import version

    return version("txcoord")
