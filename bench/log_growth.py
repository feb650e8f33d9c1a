"""Does the checker's own maintenance keep each commit log's ``_delta_log`` bounded (issue 45, point 6)?

The real checker job (``spark-submit jobs/checker.py``), its scheduled maintenance on (``maintenance_interval_ms``,
``maintenance_retention_hours``, ``maintenance_log_retention_hours`` in its TOML from ``--maintenance-every``,
``--retention-hours``, ``--log-retention-hours``; no ``txcoord maintain`` anywhere), while one producer offers
``--rate`` transactions per second for ``--minutes``. With ``--storage-latency-ms N`` the lakehouse is on the
loopback S3 server, the checker (its maintenance too) and the producer each behind a proxy adding N ms to every
request (``support.LatencyStore``); else on the local disk.

Every ``--sample-every`` seconds, each commit log's ``_delta_log``: bytes, JSON commits and checkpoints (the
files themselves: the S3 server keeps each object as a file under its data directory). Reported per log: its
size at ``--first-minutes`` (the first sample at or after it), at the end of sending and its largest since
``--first-minutes``; ``bounded`` when the size at the end is no larger than at ``--first-minutes`` (bytes and
files); and its largest in the first ``--first-minutes`` and in the last (``peaks_bounded``: the last no larger). Also: each maintenance run (the checker's log lines: tables maintained, failed, seconds), the checker's
batches from ``system/metrics`` while sending, their duration's p50 and p99 apart for batches that overlapped a
maintenance run and those that did not (does maintenance slow a batch?), and, once every send is delivered and
the checker stopped, the topic's rows against every send: ``lost``, ``duplicated``.

    python -m bench.log_growth --storage-latency-ms 25 --minutes 20 --rate 500
    python -m bench.log_growth --minutes 6 --rate 500 --first-minutes 2     # the local disk
    python -m bench.log_growth --tiny

Prints the figures and writes ``bench/results/log-growth.json`` (``log-growth-s3-<N>ms.json`` with a latency).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from bench import harness

import support

TOPIC = "BENCH_LOG_GROWTH"
GROUP = "bench-log-growth"
#: ``--tiny``: 20 s at 10 txn/s, maintenance every 3 s, the first sample at 6 s.
TINY = {"minutes": 1 / 3, "rate": 10, "threads": 4, "first_minutes": 0.1, "maintenance_every": 3, "sample_every": 2,
        "drain": 180}
#: A scheduled run's line in the checker's log (coordinator/jobs/maintenance.py), with the logging's own time.
RUN_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ coordinator\.maintenance maintenance: (\d+) table\(s\) "
                      r"maintained, (\d+) failed, (\d+) file\(s\) compacted away, (\d+) vacuumed, in ([\d.]+) s")


class LogSampler(threading.Thread):
    """Every ``every_s``, the ``_delta_log`` of each commit log under ``local_root`` (the lakehouse's files)."""

    def __init__(self, local_root: str, t0: float, every_s: float):
        super().__init__(name="log-sampler", daemon=True)
        self.local_root, self.t0, self.every_s = local_root, t0, every_s
        self.samples: list[dict] = []  # {"at_s", "log", bytes, files...}
        self._halt = threading.Event()

    def sample(self) -> None:
        groups = os.path.join(self.local_root, "groups")
        at_s = round(time.monotonic() - self.t0, 1)
        for group in sorted(os.listdir(groups)) if os.path.isdir(groups) else []:
            size = support.delta_log_size(os.path.join(groups, group, "commit_log"))
            if size is not None:
                self.samples.append({"at_s": at_s, "log": f"groups/{group}/commit_log", **size})

    def run(self) -> None:
        while not self._halt.wait(max(0.0, self.t0 + (len({s["at_s"] for s in self.samples}) + 1) * self.every_s
                                      - time.monotonic())):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample()  # the end of sending


def log_figures(samples: list[dict], first_s: float) -> dict:
    """Per commit log: its ``_delta_log`` at ``first_s`` (the first sample at or after it), at the end, its
    largest since, and ``bounded`` (the end no larger than at ``first_s``, in bytes and in files)."""
    figures = {}
    for log in sorted({s["log"] for s in samples}):
        series = [s for s in samples if s["log"] == log]
        later = [s for s in series if s["at_s"] >= first_s]
        if not later:
            figures[log] = {"bounded": None, "why": f"no sample at or after {first_s} s"}
            continue
        first, end = later[0], series[-1]
        keys = ("at_s", "log_bytes", "log_files", "log_json_files", "checkpoints")
        figures[log] = {
            "at_first": {k: first[k] for k in keys}, "at_end": {k: end[k] for k in keys},
            "max_since_first": {"log_bytes": max(s["log_bytes"] for s in later), "log_files": max(s["log_files"] for s in later)},
            "end_over_first": {"log_bytes": round(end["log_bytes"] / first["log_bytes"], 3),
                               "log_files": round(end["log_files"] / first["log_files"], 3)},
            "bounded": end["log_bytes"] <= first["log_bytes"] and end["log_files"] <= first["log_files"],
            **_peaks(series, first_s),
        }
    return figures


def _peaks(series: list[dict], window_s: float) -> dict:
    """The largest ``_delta_log`` of the first ``window_s`` and of the last: a log cleaned once per maintenance
    run is a sawtooth, and two single samples compare its phases as much as its sizes."""
    end_s = series[-1]["at_s"]
    first = [s for s in series if s["at_s"] <= window_s]
    last = [s for s in series if s["at_s"] >= end_s - window_s]
    peak = lambda samples: {k: max(s[k] for s in samples) for k in ("log_bytes", "log_files")}  # noqa: E731
    peak_first, peak_last = peak(first), peak(last)
    return {"peak_first": peak_first, "peak_last": peak_last,
            "peaks_bounded": all(peak_last[k] <= peak_first[k] for k in peak_first)}


def maintenance_runs(log_path: str) -> list[dict]:
    """Each scheduled maintenance run the checker logged: when it ended and began (``time.time()``), its counts."""
    runs = []
    for line in Path(log_path).read_text(errors="replace").splitlines():
        match = RUN_LINE.match(line)
        if match:
            ended = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # the checker's local time
            seconds = float(match[6])
            runs.append({"began": ended - seconds, "ended": ended, "seconds": seconds, "maintained": int(match[2]),
                         "failed": int(match[3]), "compacted": int(match[4]), "vacuumed": int(match[5])})
    return runs


def batch_figures(batches: list[dict], runs: list[dict]) -> dict:
    """Batch duration p50/p99 (ms), for all batches, those that overlapped a maintenance run and the others."""
    def overlaps(batch: dict) -> bool:
        return any(batch["started_at"] < run["ended"] and run["began"] < batch["finished_at"] for run in runs)

    def summary(durations: list[float]) -> dict:
        ordered = sorted(durations)
        return {"batches": len(ordered), "p50_ms": harness.percentile(ordered, 0.5),
                "p99_ms": harness.percentile(ordered, 0.99)}

    return {"all": summary([b["duration_ms"] for b in batches]),
            "beside_maintenance": summary([b["duration_ms"] for b in batches if overlaps(b)]),
            "without_maintenance": summary([b["duration_ms"] for b in batches if not overlaps(b)])}


def wait_delivered(lakehouse, wanted: set[str], timeout_s: float) -> float:
    """Seconds until every one of ``wanted`` is in the topic (or ``timeout_s`` passed)."""
    from coordinator.lakehouse import read_table

    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if lakehouse.exists(f"topics/{TOPIC}") and wanted <= set(
                read_table(lakehouse.topic(TOPIC), ["transaction_id"], storage=lakehouse.storage).column(0).to_pylist()):
            break
        time.sleep(2)
    return round(time.monotonic() - began, 1)


@contextlib.contextmanager
def lakehouse_for(latency_ms: float):
    """``(lakehouse, its local directory, the latency store or None)``: a fresh lakehouse on the local disk, or
    on the S3 server behind a latency (the server keeps each object as a file: the local directory)."""
    with tempfile.TemporaryDirectory(prefix="bench-log-growth-") as workdir:
        if not latency_ms:
            yield None, None, None
            return
        with support.LatencyStore(latency_ms, workdir) as store:
            lakehouse = store.new_lakehouse()
            yield lakehouse, os.path.join(workdir, "s3", store.bucket, lakehouse.root.split("/", 3)[3]), store


def main(argv: list[str] | None = None) -> dict:
    from coordinator import CoordinatorConfig, TransactionProducer
    from coordinator.lakehouse import read_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20, help="sending time")
    parser.add_argument("--rate", type=float, default=500, help="offered transactions per second")
    parser.add_argument("--threads", type=int, default=64, help="sender threads (≥ rate × send latency)")
    parser.add_argument("--first-minutes", type=float, default=5, help="the size the end is compared with: at this time")
    parser.add_argument("--maintenance-every", type=float, default=60,
                        help="the checker's maintenance_interval_ms, in seconds (0: off)")
    parser.add_argument("--retention-hours", type=int, default=1, help="maintenance_retention_hours")
    parser.add_argument("--log-retention-hours", type=float, default=0.05, help="maintenance_log_retention_hours")
    parser.add_argument("--sample-every", type=float, default=15, help="seconds between two samples of each _delta_log")
    parser.add_argument("--storage-latency-ms", type=float, default=0, help=support.LATENCY_HELP)
    parser.add_argument("--trigger-ms", type=int, default=CoordinatorConfig().trigger_interval_ms)
    parser.add_argument("--drain", type=float, default=600, help="seconds to wait for the last deliveries")
    parser.add_argument("--startup-timeout", type=float, default=300)
    parser.add_argument("--results", default=None)
    args = harness.parse_args(parser, argv, "log-growth", TINY)
    results = Path(args.results or harness.RESULTS / (
        f"log-growth-s3-{args.storage_latency_ms:g}ms.json" if args.storage_latency_ms else "log-growth.json"))
    report = harness.start_report("log-growth", vars(args))
    seconds = args.minutes * 60
    settings = {"maintenance_interval_ms": round(args.maintenance_every * 1000),
                "maintenance_retention_hours": args.retention_hours,
                "maintenance_log_retention_hours": args.log_retention_hours}
    with lakehouse_for(args.storage_latency_ms) as (object_store, object_dir, store):
        directory, checker = support.checker_on_fresh_lakehouse(
            None, "log-growth", args.trigger_ms, object_store,
            checker_storage=None if store is None else store.storage("checker"), **settings)
        lakehouse = checker.lakehouse
        sampler = None
        try:
            print(f"starting the checker (trigger {args.trigger_ms} ms, maintenance every {args.maintenance_every:g} s, "
                  f"log retention {args.log_retention_hours:g} h)...", flush=True)
            report["checker_start_s"] = checker.wait_ready(args.startup_timeout)
            print(f"  first batch after {report['checker_start_s']} s; {args.rate:g} txn/s for {args.minutes:g} min",
                  flush=True)
            t0, t0_wall = time.monotonic(), time.time()
            sampler = LogSampler(object_dir or lakehouse.root, t0, args.sample_every)
            sampler.start()
            config = CoordinatorConfig(lakehouse=lakehouse.root,
                                       storage=lakehouse.storage if store is None else store.storage("producer"))
            with TransactionProducer(GROUP, support.Commits(), config) as producer:
                sender = support.SteadySender(producer, TOPIC, args.rate, seconds, args.threads)
                send_seconds = sender.run()
            end_wall = time.time()
            sampler.stop()
            wanted = {tid for tid, _, _ in sender.sent}
            print(f"  sent {len(wanted)} in {send_seconds:.1f} s ({len(wanted) / send_seconds:.1f} txn/s, "
                  f"{sender.errors} errors, {sender.unsent} unsent); waiting for delivery...", flush=True)
            drained_after = wait_delivered(lakehouse, wanted, args.drain)
            batches = [b for b in support.recorded_batches(lakehouse, t0_wall) if b["started_at"] <= end_wall]
        finally:
            if sampler is not None and sampler.is_alive():
                sampler.stop()
            exit_code = checker.stop()
        rows = read_table(lakehouse.topic(TOPIC), ["transaction_id"], storage=lakehouse.storage).column(0).to_pylist()
        counts = support.tally_deliveries(wanted, rows).counts()
        runs = maintenance_runs(checker.log_path)
        logs = log_figures(sampler.samples, args.first_minutes * 60)
        report.update({
            "storage": store.settings() if store is not None else "local disk",
            "sent": len(wanted), "achieved_txn_per_s": round(len(wanted) / send_seconds, 1), "send_errors": sender.errors,
            "unsent": sender.unsent, "drained_after_s": drained_after, "checker_exit_code": exit_code,
            "counts": counts, "commit_logs": logs,
            "bounded": bool(logs) and all(figure["bounded"] for figure in logs.values()),
            "maintenance_runs": [{k: run[k] for k in ("seconds", "maintained", "failed", "compacted", "vacuumed")}
                                 | {"ended_at_s": round(run["ended"] - t0_wall, 1)} for run in runs],
            "batch_duration": batch_figures(batches, [r for r in runs if r["ended"] >= t0_wall]),
            "log_samples": sampler.samples,
        })
        if args.tiny:
            shutil.rmtree(directory, ignore_errors=True)
    print_report(report)
    return harness.finish_report(report, results)


def print_report(report: dict) -> None:
    for log, figure in report["commit_logs"].items():
        if figure["bounded"] is None:
            print(f"{log}: {figure['why']}")
            continue
        first, end, top = figure["at_first"], figure["at_end"], figure["max_since_first"]
        print(f"{log} _delta_log: at {first['at_s']} s {first['log_bytes'] / 2**20:.1f} MiB in {first['log_files']} files "
              f"({first['log_json_files']} commits, {first['checkpoints']} checkpoints); at the end ({end['at_s']} s) "
              f"{end['log_bytes'] / 2**20:.1f} MiB in {end['log_files']} files ({end['log_json_files']} commits, "
              f"{end['checkpoints']} checkpoints); largest since {top['log_bytes'] / 2**20:.1f} MiB, {top['log_files']} files; "
              f"end/first {figure['end_over_first']['log_bytes']} (bytes), {figure['end_over_first']['log_files']} (files)")
        peak_first, peak_last = figure["peak_first"], figure["peak_last"]
        print(f"{log} _delta_log at its largest: in the first {report['args']['first_minutes']:g} min "
              f"{peak_first['log_bytes'] / 2**20:.1f} MiB, {peak_first['log_files']} files; in the last "
              f"{peak_last['log_bytes'] / 2**20:.1f} MiB, {peak_last['log_files']} files "
              f"({'no larger' if figure['peaks_bounded'] else 'LARGER'})")
    runs = report["maintenance_runs"]
    print(f"maintenance runs {len(runs)}: {sum(r['failed'] for r in runs)} table failures, "
          f"seconds {', '.join(str(r['seconds']) for r in runs) or '-'}")
    for name, figure in report["batch_duration"].items():
        print(f"batches {name}: {figure['batches']}, p50 {figure['p50_ms']} ms, p99 {figure['p99_ms']} ms")
    print(f"sent {report['sent']} ({report['achieved_txn_per_s']} txn/s), {report['unsent']} unsent, "
          f"{report['send_errors']} errors; drained after {report['drained_after_s']} s; counts {report['counts']}; "
          f"checker exit {report['checker_exit_code']}")
    print(f"verdict: {'BOUNDED' if report['bounded'] else 'NOT bounded'} (each commit log's _delta_log at the end no "
          f"larger than at {report['args']['first_minutes']:g} min)", flush=True)


if __name__ == "__main__":
    main()
