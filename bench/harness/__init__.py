"""What the benchmarks and the chaos harness share: offered load (from one producer, or from processes started
together, a producer each), object storage at a chosen latency (a proxy per party, its requests priced), Spark
in-process, operators' views (metrics endpoint, console) and the report every benchmark writes; and,
re-exported from the test support (:mod:`tests.support`), processes and waiting for them, the real checker job
and what it has done (from ``system/metrics``, the progress record and the lease), records as producers write
them, the exactly-once verdict and Delta logs read as files.

Example::

    from bench import harness

    with harness.CheckerJob(config_path, lakehouse, "checker.log") as checker:
        checker.wait_ready(180)
        harness.wait_until(lambda: checker.lag() == 0, 60, "the checker to catch up")
"""

from bench.harness.console import ConsoleBrowser, ConsoleJob, MetricsScraper
from bench.harness.load import (
    PROCESS_START_TIMEOUT_S,
    StartedTogether,
    SteadySender,
    SteadyShares,
    send_on_schedule,
    steady_share,
)
from bench.harness.object_store import (
    LATENCY_HELP,
    S3_PRICES,
    LatencyStore,
    idle_cost_per_day,
    request_cost,
    requests_between,
)
from bench.harness.report import RESULTS, ROOT, TINY_HELP, finish_report, machine, median, parse_args, percentile, start_report
from bench.harness.spark import BatchDriver, jvm_memory, reach_object_store, spark_session, streaming_triggers
from tests.support import (
    BODY,
    CheckerJob,
    Commits,
    Deliveries,
    Delivery,
    Job,
    LagSampler,
    Periodically,
    TopicFollower,
    checker_on_fresh_lakehouse,
    child_environment,
    commit_rows,
    commits,
    deliveries,
    delta_log_size,
    end_record,
    first_batch_after,
    free_port,
    half_record,
    half_rows,
    holds_lease,
    latest_version,
    log_versions,
    proc_status,
    process_tree_rss,
    recorded_batches,
    reset_peak_rss,
    served_metrics_url,
    stands_by,
    table_shape,
    tally_deliveries,
    wait_until,
    write_config,
)

__all__ = [
    "BODY", "BatchDriver", "CheckerJob", "Commits", "ConsoleBrowser", "ConsoleJob", "Deliveries", "Delivery", "Job",
    "LATENCY_HELP", "LagSampler", "LatencyStore", "S3_PRICES", "idle_cost_per_day", "request_cost", "requests_between", "MetricsScraper", "PROCESS_START_TIMEOUT_S", "Periodically", "RESULTS", "ROOT", "StartedTogether", "SteadySender", "SteadyShares", "TINY_HELP", "TopicFollower", "checker_on_fresh_lakehouse",
    "child_environment", "commit_rows", "commits", "deliveries", "delta_log_size", "end_record", "finish_report",
    "first_batch_after", "free_port", "half_record", "half_rows", "holds_lease", "jvm_memory", "latest_version", "log_versions", "machine", "median",
    "parse_args", "percentile", "proc_status", "process_tree_rss", "reach_object_store", "recorded_batches",
    "reset_peak_rss", "send_on_schedule", "served_metrics_url", "spark_session", "stands_by", "start_report", "steady_share", "streaming_triggers",
    "table_shape", "tally_deliveries", "wait_until", "write_config",
]
