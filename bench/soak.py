"""Soak: ``--minutes`` at a steady rate with table maintenance on. Does a batch cost the same at
the end as at the start, and do the Delta logs and file counts stay bounded?

The real checker job (``spark-submit jobs/checker.py``) runs while one producer process offers
``--rate`` transactions per second for ``--minutes`` (no-op local transaction that commits; a
producer that falls behind still stops then, and the sends it never started are reported as
``unsent``), and a thread runs
``coordinator.ops.maintenance.maintain(lakehouse, retention_hours=--retention-hours,
log_retention_hours=--log-retention-hours)`` every ``--maintenance-every`` seconds (the default
log retention, a quarter of an hour, lets a 30-minute run show the logs levelling off). Batch durations come from ``system/metrics`` (one row per
checker batch, read with delta-rs); the start and end windows are the first and last
``--window`` fraction of the sending time (the checker's first batch, its warm-up, is left
out). The log length (``_delta_log/*.json``), checkpoints, active data files and Parquet files
on disk of the commit log, system/half, system/op and the topic are taken when sending starts,
when it ends, and after one more maintenance run once the checker has stopped (the end figures
depend on how long ago maintenance last ran).

    python bench/soak.py                          # 30 minutes at 200 txn/s, maintenance every 5 min
    python bench/soak.py --minutes 3 --rate 20 --maintenance-every 60
    python bench/soak.py --tiny                   # 6 s at 10 txn/s, for the tests (tests/test_bench.py)

Prints a table and writes ``bench/results/soak.json`` (``--results`` to change).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

TOPIC = "BENCH_SOAK"
#: ``--tiny``: 6 s at 10 txn/s, maintenance every 2 s, start and end windows of half the run each.
TINY = {"minutes": 0.1, "rate": 10, "threads": 4, "maintenance_every": 2, "window": 0.5}


class Maintainer(threading.Thread):
    """Runs table maintenance every ``every_s`` seconds, as a scheduler would."""

    def __init__(self, lakehouse: str, every_s: float, retention_hours: int, log_retention_hours: float, t0: float):
        super().__init__(name="maintenance", daemon=True)
        self.lakehouse, self.every_s, self.t0 = lakehouse, every_s, t0
        self.retention_hours, self.log_retention_hours = retention_hours, log_retention_hours
        self.runs: list[dict] = []
        self._halt = threading.Event()

    def run(self) -> None:
        from coordinator.ops.maintenance import maintain

        while not self._halt.wait(self.every_s):
            started = time.monotonic()
            try:
                results = maintain(self.lakehouse, retention_hours=self.retention_hours,
                                   log_retention_hours=self.log_retention_hours)
                error = None
            except Exception as exc:  # recorded, never fatal: the soak goes on
                results, error = [], f"{type(exc).__name__}: {exc}"
            self.runs.append({
                "at_s": round(started - self.t0, 1),
                "seconds": round(time.monotonic() - started, 1),
                "error": error,
                "compacted": sum(r.files_compacted for r in results),
                "vacuumed": sum(r.files_vacuumed for r in results),
                "skipped": [f"{r.table}: {s}" for r in results for s in r.skipped],
            })

    def stop(self) -> None:
        self._halt.set()
        self.join()


def shapes(lakehouse: str) -> dict:
    from coordinator.lakehouse import Lakehouse
    from coordinator.tables import HALF, OP

    log = "groups/bench-soak/commit_log"
    return {name: benchlib.table_shape(path) for name, path in [
        (log, Lakehouse(lakehouse).key_path(log)), ("system/half", Lakehouse(lakehouse).path(HALF)),
        ("system/op", Lakehouse(lakehouse).path(OP)), (f"topics/{TOPIC}", Lakehouse(lakehouse).topic(TOPIC))]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=200, help="offered transactions per second")
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--trigger-ms", type=int, default=1000, help="checker trigger_interval_ms")
    parser.add_argument("--maintenance-every", type=float, default=300, help="seconds between maintenance runs")
    parser.add_argument("--retention-hours", type=int, default=1)
    parser.add_argument("--log-retention-hours", type=float, default=0.25,
                        help="maintain's log_retention_hours: how long the Delta logs keep a commit")
    parser.add_argument("--window", type=float, default=0.2, help="fraction of the run that makes the start / end window")
    parser.add_argument("--startup-timeout", type=float, default=300)
    parser.add_argument("--lakehouse", default=None, help="default: a temporary directory, removed afterwards")
    parser.add_argument("--results", default=str(benchlib.RESULTS / "soak.json"))
    args = benchlib.parse_args(parser, argv, "soak", TINY)
    report = benchlib.start_report("soak", vars(args))

    from coordinator import CoordinatorConfig, TransactionProducer
    from coordinator.lakehouse import Lakehouse, read_table
    from coordinator.tables import METRICS

    lakehouse, checker = benchlib.checker_on_fresh_lakehouse(args.lakehouse, "soak", args.trigger_ms)
    sampler = maintainer = None
    seconds = args.minutes * 60
    try:
        print(f"starting the checker (trigger {args.trigger_ms} ms)...", flush=True)
        report["checker_start_s"] = checker.wait_ready(args.startup_timeout)
        print(f"  first batch after {report['checker_start_s']} s; {args.rate:g} txn/s for {args.minutes:g} min, "
              f"maintenance every {args.maintenance_every:g} s", flush=True)
        report["shape_start"] = shapes(lakehouse)
        t0 = time.monotonic()
        start_wall = datetime.now(timezone.utc)
        sampler = benchlib.LagSampler(checker, t0)
        maintainer = Maintainer(lakehouse, args.maintenance_every, args.retention_hours, args.log_retention_hours, t0)
        sampler.start()
        maintainer.start()
        with TransactionProducer("bench-soak", benchlib.Commits(), CoordinatorConfig(lakehouse=lakehouse)) as producer:
            sender = benchlib.SteadySender(producer, TOPIC, args.rate, seconds, args.threads)
            send_seconds = sender.run()
        end_wall = datetime.now(timezone.utc)
        report["shape_end"] = shapes(lakehouse)
    finally:
        for thread in (maintainer, sampler):
            if thread is not None:
                thread.stop()
        exit_code = checker.stop()
    # The end shape depends on how long ago maintenance last ran: one more run shows what it leaves.
    from coordinator.ops.maintenance import maintain

    maintain(lakehouse, retention_hours=args.retention_hours, log_retention_hours=args.log_retention_hours)
    report["shape_end_after_maintenance"] = shapes(lakehouse)

    metrics = read_table(Lakehouse(lakehouse).path(METRICS), ["batch_id", "started_at", "duration_ms", "records"]).to_pylist()
    window = seconds * args.window
    during = [m for m in metrics if start_wall <= m["started_at"] <= end_wall]
    start_batches = [m["duration_ms"] for m in during if (m["started_at"] - start_wall).total_seconds() < window]
    end_batches = [m["duration_ms"] for m in during if (end_wall - m["started_at"]).total_seconds() < window]
    start_median, end_median = benchlib.median(start_batches), benchlib.median(end_batches)
    lags = [lag for _, lag, _ in sampler.samples]
    figures = {
        "sent": len(sender.sent),
        "achieved_txn_per_s": round(len(sender.sent) / send_seconds, 1),
        "send_errors": sender.errors,
        "unsent": sender.unsent,
        "batches": len(during),
        "batch_ms_start_median": start_median,
        "batch_ms_end_median": end_median,
        "batch_ms_end_over_start": round(end_median / start_median, 3) if start_median and end_median else None,
        "batches_in_start_window": len(start_batches),
        "batches_in_end_window": len(end_batches),
        "lag_max_versions": max(lags, default=None),
        "lag_end_versions": lags[-1] if lags else None,
        "maintenance_runs": maintainer.runs,
        "checker_exit_code": exit_code,
    }
    print(f"\n{'':>22} {'log json':>16} {'checkpoints':>12} {'active files':>16} {'files on disk':>16}")
    print(f"{'':>22} {'(start → end → after one more maintenance run)':>64}")
    for name in report["shape_start"]:
        a, b, c = (report[key][name] for key in ("shape_start", "shape_end", "shape_end_after_maintenance"))
        if not c.get("exists"):
            print(f"{name:>22} (no table)")
            continue
        a, b = (x if x.get("exists") else {k: 0 for k in c} for x in (a, b))
        print(f"{name:>22} " + " ".join(f"{f'{a[k]}→{b[k]}→{c[k]}':>{w}}" for k, w in [
            ("log_json_files", 16), ("checkpoints", 12), ("active_files", 16), ("parquet_files_on_disk", 16)]))
    f = figures
    print(f"\nbatches {f['batches']}; median batch ms: start {f['batch_ms_start_median']} ({f['batches_in_start_window']} "
          f"batches), end {f['batch_ms_end_median']} ({f['batches_in_end_window']}), end/start {f['batch_ms_end_over_start']}")
    print(f"sent {f['sent']} ({f['achieved_txn_per_s']} txn/s), {f['unsent']} unsent; lag max {f['lag_max_versions']}, at end "
          f"{f['lag_end_versions']} versions; maintenance runs {len(maintainer.runs)}; checker exit code {exit_code}")
    report.update(figures)
    report["batch_durations"] = [(m["batch_id"], m["started_at"].isoformat(), m["duration_ms"], m["records"])
                                 for m in metrics]
    report["lag_samples"] = sampler.samples
    if args.lakehouse is None:
        shutil.rmtree(lakehouse, ignore_errors=True)
    return benchlib.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
