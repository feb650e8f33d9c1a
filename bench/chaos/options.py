"""The chaos run's options (its command line) and settings: the timings of the coordinator it runs, the
mix of transactions, the storage faults."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

from bench import harness
from bench.chaos.producer import KINDS

__all__ = ["CONFIG_NAME", "FORGED_GROUP", "KIND_WEIGHTS", "OBJECT_STORE_BUCKET", "Options", "POISON_EVERY_S",
           "POISON_GROUP", "RESET_BACK_S", "SETTINGS",
           "STORAGE_FAULT_DELAY_S", "STORAGE_FAULT_RATES", "TINY", "parse_options"]

#: The bucket of ``--object-store`` runs.
OBJECT_STORE_BUCKET = "chaos"
#: ``--storage-faults``: each request's chance of each fault (coordinator/conformance/faults.py), about one in
#: twenty faulty in all, and a delayed request's wait.
STORAGE_FAULT_RATES = {"slowdown": 0.02, "error": 0.01, "delay": 0.005, "reset": 0.01, "drop_reply": 0.01}
STORAGE_FAULT_DELAY_S = 1.0
CONFIG_NAME = "chaos.toml"
#: Short timings, so unknown transactions are checked and discarded within the run.
SETTINGS = {
    "transaction_timeout_ms": 3000,
    "transaction_check_interval_ms": 3000,
    "transaction_check_max": 3,
    "trigger_interval_ms": 1000,
}
#: Relative frequency of each kind of planned transaction (every kind also appears at least once).
KIND_WEIGHTS = {"commit": 40, "rollback": 10, "unknown_then_commit": 10, "unknown_then_rollback": 10,
                "unknown_forever": 5, "listener_raises": 10, "multi_topic_commit": 15}
#: The group hostile records pretend to be: no process answers its checks.
FORGED_GROUP = "chaos_forged"
#: ``--poison``: the poisoning tenant's group (no process answers its checks either), and how often it writes
#: every poison again while the honest groups send.
POISON_GROUP = "chaos_poison"
POISON_EVERY_S = 3.0
#: ``--consumer-resets``: a reset to an ISO time goes back this many seconds at most (drawn).
RESET_BACK_S = 10.0
#: ``--tiny``: a few transactions (every kind, and more than one of some) from two producers over 5 s, one
#: checker, one producer and one consumer kill. Its seed plans two transactions held for review, so the run goes through a
#: recovery (the operator commits the first discard) even when the producer kill cuts one of the two short.
#: Its timeout leaves room for a machine whose two cores run other tests too.
TINY = {"transactions": 10, "producers": 2, "checker_kills": 1, "producer_kills": 1, "consumer_kills": 1, "seed": 15,
        "send_seconds": 5.0,
        "maintenance_every": 5.0, "timeout": 600.0}


@dataclass(frozen=True)
class Options:
    """A run's options, as ``python -m bench.chaos --help`` describes them."""

    transactions: int = 150
    producers: int = 3
    checker_kills: int = 2
    producer_kills: int = 3
    consumers: int = 2
    consumer_kills: int = 2
    consumer_pauses: int = 3
    consumer_resets: int = 1
    dead_letter_rounds: int = 2
    reset_to: str = "drawn"
    seed: int = 1
    lakehouse: str = "chaos-lakehouse"
    results: str = str(harness.RESULTS / "chaos.json")
    timeout: float = 600.0
    send_seconds: float = 45.0
    maintenance_every: float = 10.0
    retention_hours: int = 1
    standby: bool = False
    object_store: bool = False
    storage_faults: bool = False
    poison: bool = False


#: The harness's events on the consumer group: none by default in a run without one.
_CONSUMER_EVENTS = ("consumer_kills", "consumer_pauses", "consumer_resets", "dead_letter_rounds")


def parse_options(argv: Optional[list[str]] = None) -> Options:
    defaults = Options()
    parser = argparse.ArgumentParser(prog="python -m bench.chaos",
                                     description="Kill the checker and producers at random; verify docs/design.md#invariants.")
    parser.add_argument("--transactions", type=int, default=defaults.transactions, help="planned transactions in all")
    parser.add_argument("--producers", type=int, default=defaults.producers, help="producer processes")
    parser.add_argument("--checker-kills", type=int, default=defaults.checker_kills)
    parser.add_argument("--producer-kills", type=int, default=defaults.producer_kills)
    parser.add_argument("--consumers", type=int, default=defaults.consumers,
                        help="processes of the consumer group (bench/chaos/consumer.py) on both topics; 0: none")
    parser.add_argument("--consumer-kills", type=int, default=None,
                        help="kill -9 of a consumer process while it handles, each restarted at once")
    parser.add_argument("--consumer-pauses", type=int, default=None,
                        help="SIGSTOP of a consumer process for 2 or 5 times the liveness window, then SIGCONT; in "
                             "turn inside a listener call (before its record, holding its transaction) or from outside")
    parser.add_argument("--consumer-resets", type=int, default=None,
                        help="the operator stops the consumer group, resets each topic (earliest, or an ISO time a few "
                             "seconds back) and starts it again")
    parser.add_argument("--dead-letter-rounds", type=int, default=None,
                        help="the operator redrives some open dead letters and discards others while the group runs")
    parser.add_argument("--reset-to", choices=("drawn", "earliest", "back"), default=defaults.reset_to,
                        help=f"where each reset moves each topic: earliest, back (an ISO time up to {RESET_BACK_S:g} s "
                             "before it), or either, drawn per topic")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seeds the plan and every random moment")
    parser.add_argument("--lakehouse", default=defaults.lakehouse, help="wiped and recreated (must be empty or a chaos run's)")
    parser.add_argument("--results", default=defaults.results, help="where to write the JSON report")
    parser.add_argument("--timeout", type=float, default=defaults.timeout, help="give up this many seconds after the start")
    parser.add_argument("--send-seconds", type=float, default=defaults.send_seconds,
                        help="the producers spread their sends over this many seconds")
    parser.add_argument("--maintenance-every", type=float, default=defaults.maintenance_every,
                        help="seconds between two maintenance runs")
    parser.add_argument("--retention-hours", type=int, default=defaults.retention_hours,
                        help="vacuum retention passed to maintain(), at least 1 (hours) while producers write")
    parser.add_argument("--standby", action="store_true",
                        help="run a second checker standing by; each checker kill hits the active one")
    parser.add_argument("--object-store", action="store_true",
                        help="the lakehouse on a loopback S3 server (coordinator/conformance/versitygw.py); --lakehouse keeps the logs")
    parser.add_argument("--storage-faults", action="store_true",
                        help="with --object-store: every request through coordinator/conformance/faults.py, which answers "
                             "503 and 500, delays, resets connections and drops replies after the write, at random "
                             f"(seeded by --seed; rates {STORAGE_FAULT_RATES}) until the kills are done")
    parser.add_argument("--poison", action="store_true",
                        help="a poisoning tenant writes, into its own prefix, every kind of bytes the checker must "
                             f"refuse (support/poisons.py), every {POISON_EVERY_S:g} s while the producers send")
    args = harness.parse_args(parser, argv, "chaos", TINY)
    if args.storage_faults and not args.object_store:
        parser.error("--storage-faults needs --object-store: the faults are those of an S3 server's")
    if args.transactions < len(KINDS):
        parser.error(f"--transactions must be at least {len(KINDS)}, one of each kind")
    if args.producers < 1 or args.checker_kills < 0 or args.producer_kills < 0:
        parser.error("--producers must be at least 1, kill counts at least 0")
    given = {name: getattr(args, name) for name in _CONSUMER_EVENTS}
    if args.consumers < 0 or any(count is not None and count < 0 for count in given.values()) or (
            not args.consumers and any(given.values())):
        parser.error("--consumers must be at least 0, and at least 1 with --consumer-kills, --consumer-pauses, "
                     "--consumer-resets or --dead-letter-rounds (each at least 0)")
    for name, count in given.items():  # none by default without consumers: nothing to do them to
        setattr(args, name, count if count is not None else getattr(defaults, name) if args.consumers else 0)
    return Options(**{name: value for name, value in vars(args).items() if name != "tiny"})

