"""What the tests, the benchmarks and the chaos harness share, in one place: processes and waiting for them,
the real checker job and what it has done, records as producers write them, Delta logs read as files, the
exactly-once verdict, a clock moved by hand, and commands run as a user runs them. The benchmarks reach it
through :mod:`bench.harness`.

This package loads nothing of the product, pyarrow or pytest, so neither does the harness that re-exports
it. Modules that do are imported by name: :mod:`tests.support.batches` (the checker's batch logic driven
batch by batch), :mod:`~tests.support.lakehouse` (tables written directly), :mod:`~tests.support.poisons`
(hostile bytes), :mod:`~tests.support.producer_side`, :mod:`~tests.support.console_client` and
:mod:`~tests.support.servers` (the object stores on loopback).

Example::

    from tests.support import end_record, half_record
    from tests.support.batches import ManualChecker

    checker = ManualChecker(config)
    checker.write(half_record("t1"), end_record("t1"))
    checker.run()                                                  # one batch, on the driver
"""

from tests.support.checker import (
    CheckerJob,
    LagSampler,
    checker_on_fresh_lakehouse,
    first_batch_after,
    holds_lease,
    recorded_batches,
    served_metrics_url,
    stands_by,
    write_config,
)
from tests.support.clock import Clock
from tests.support.deltalog import (
    Delivery,
    TopicFollower,
    commits,
    deliveries,
    delta_log_size,
    latest_version,
    log_versions,
    table_shape,
)
from tests.support.environment import DEMO_ORDERS, run_checked, user_environment, without_txcoord_settings
from tests.support.exactly_once import Deliveries, tally_deliveries
from tests.support.listeners import Commits
from tests.support.processes import Job, child_environment, free_port, proc_status, process_tree_rss, reset_peak_rss
from tests.support.records import BODY, commit_rows, end_record, half_record, half_rows
from tests.support.waiting import Periodically, wait_until

__all__ = [
    "BODY", "CheckerJob", "Clock", "Commits", "DEMO_ORDERS", "Deliveries", "Delivery", "Job", "LagSampler",
    "Periodically", "TopicFollower", "checker_on_fresh_lakehouse", "child_environment", "commit_rows", "commits",
    "deliveries", "delta_log_size", "end_record", "first_batch_after", "free_port", "half_record", "half_rows",
    "holds_lease", "latest_version", "log_versions", "proc_status", "process_tree_rss", "recorded_batches",
    "reset_peak_rss", "run_checked", "served_metrics_url", "stands_by", "table_shape", "tally_deliveries",
    "user_environment", "wait_until", "without_txcoord_settings", "write_config",
]
