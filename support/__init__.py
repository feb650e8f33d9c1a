"""What the tests, the benchmarks and the chaos harness share, in one place (``tests/`` and ``bench/`` import
this package, never each other): processes and waiting for them, the real checker job and what it has done,
records as producers write them, Delta logs read as files, the exactly-once verdict, a clock moved by hand,
commands run as a user runs them, offered load, object storage at a chosen latency (the product's storage-fault
proxy, :mod:`coordinator.conformance.faults`, a proxy per party, its requests priced), Spark in-process and operators' views (metrics
endpoint, console). The pytest fixtures built from them are the plugin :mod:`support.fixtures`.

This package loads nothing of the product, pyarrow or pytest. Modules that do are imported by name:
:mod:`support.batches` (the checker's batch logic driven batch by batch), :mod:`~support.lakehouse` (tables
written directly), :mod:`~support.poisons` (hostile bytes, and the tenant that writes them),
:mod:`~support.producer_side`, :mod:`~support.console_client`, :mod:`~support.servers` (the object stores on
loopback) and :mod:`~support.fixtures`.

Example::

    from support import end_record, half_record
    from support.batches import ManualChecker

    checker = ManualChecker(config)
    checker.write(half_record("t1"), end_record("t1"))
    checker.run()                                                  # one batch, on the driver
"""

from support.console import ConsoleBrowser, ConsoleJob, MetricsScraper
from support.load import (
    PROCESS_START_TIMEOUT_S,
    StartedTogether,
    SteadySender,
    SteadyShares,
    send_on_schedule,
    steady_share,
)
from support.object_store import (
    LATENCY_HELP,
    S3_PRICES,
    LatencyStore,
    idle_cost_per_day,
    request_cost,
    requests_between,
)
from support.quantiles import median, percentile
from support.spark import BatchDriver, jvm_memory, reach_object_store, spark_session, streaming_triggers
from support.checker import (
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
from support.clock import Clock
from support.deltalog import (
    Delivery,
    TopicFollower,
    commits,
    deliveries,
    delta_log_size,
    latest_version,
    log_versions,
    table_shape,
)
from support.environment import DEMO_ORDERS, REPO_ROOT, run_checked, user_environment, without_txcoord_settings
from support.exactly_once import Deliveries, tally_deliveries
from support.listeners import Commits
from support.processes import Job, child_environment, free_port, proc_status, process_tree_rss, reset_peak_rss
from support.records import BODY, commit_rows, end_record, half_record, half_rows
from support.waiting import Periodically, wait_until

__all__ = [
    "BatchDriver", "BODY", "checker_on_fresh_lakehouse", "CheckerJob", "child_environment", "Clock", "commit_rows",
    "commits", "Commits", "ConsoleBrowser", "ConsoleJob", "Deliveries", "deliveries", "Delivery", "delta_log_size",
    "DEMO_ORDERS", "end_record", "first_batch_after", "free_port", "half_record", "half_rows", "holds_lease",
    "idle_cost_per_day", "Job", "jvm_memory", "LagSampler", "LATENCY_HELP", "LatencyStore", "latest_version",
    "log_versions", "median", "MetricsScraper", "percentile", "Periodically", "proc_status",
    "PROCESS_START_TIMEOUT_S", "process_tree_rss", "reach_object_store", "recorded_batches", "REPO_ROOT",
    "request_cost", "requests_between", "reset_peak_rss", "run_checked", "S3_PRICES", "send_on_schedule",
    "served_metrics_url", "spark_session", "stands_by", "StartedTogether", "steady_share", "SteadySender",
    "SteadyShares", "streaming_triggers", "table_shape", "tally_deliveries", "TopicFollower", "user_environment",
    "wait_until", "without_txcoord_settings", "write_config",
]
