"""The checker's source beside many idle commit logs, on object storage at a chosen latency: do its requests
follow the busy logs or all of them, and how soon is a long-idle log's next record found?

Two lakehouses on the loopback S3 server: *busy* with ``--busy`` groups, each written by a commit-log writer
of its own about every ``--commit-every-ms``; *mixed* with the same busy groups and ``--idle`` more, each
a commit log made before the run (its version 0) and written nothing after. On each, the checker's streaming source
(``CommitLogReader.read``, what Spark calls at every trigger, run here every ``--trigger-ms`` as the checker's
trigger interval does, no Spark) follows the logs through the checker's proxy; after a warm-up long enough for
idle groups to fall asleep (``coordinator.doorbells``: until every one sleeps), its requests are counted for ``--seconds``. The rest of
a trigger's requests (the Spark checkpoint, the lease, the tables' appends) follow the batch, not the number of
logs, so the source's ratio *mixed* / *busy* bounds the whole checker's from above. Then, on *mixed*,
``--wakes`` idle groups each get one record, one after another, and the time from its commit's landing to the
source's offset covering it is measured.

    python -m bench.idle_logs --storage-latency-ms 25                 # 10 busy groups, 1,000 idle, 30 s each
    python -m bench.idle_logs --tiny                                  # the smallest run, for the tests

Prints the figures and writes ``bench/results/idle-logs-s3-<N>ms.json`` (``--results`` to change); targets
(issue 45 point 4): requests a second at most 2x the busy groups' alone, each long-idle record found within 2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import harness

import support

from coordinator import Message
from coordinator.checker.source import CommitLogReader
from coordinator.doorbells import QUIET_AFTER_S
from coordinator.lakehouse import Lakehouse, create_table, init_lakehouse
from coordinator.producer.commit_log import CommitLogWriter, half_records
from coordinator.tables import COMMIT_LOG

TINY = {"busy": 2, "idle": 20, "seconds": 2.0, "wakes": 2, "warmup_s": 1.0,
        "storage_latency_ms": 5.0}
TARGET_RATIO = 2.0
TARGET_FOUND_S = 2.0


class Source:
    """The checker's source on a lakehouse, read every ``trigger_s`` in a thread, as Spark's trigger would."""

    def __init__(self, lakehouse: Lakehouse, trigger_s: float):
        self.reader = CommitLogReader(lakehouse, {})
        self.offset = self.reader.initialOffset()
        self.triggers = 0
        self.following = support.Periodically(self._trigger, trigger_s)

    def _trigger(self) -> None:
        _, self.offset = self.reader.read(self.offset)
        self.triggers += 1

    def covers(self, log: str, version: int) -> bool:
        return self.offset["versions"].get(log, 0) > version


class BusyWriter:
    """A commit-log writer of ``group`` submitting a record about every ``every_s`` while ``writing``."""

    def __init__(self, lakehouse: Lakehouse, group: str, every_s: float):
        self.group, self.commits = group, 0
        self.log = CommitLogWriter(lakehouse, group)
        self.writing = support.Periodically(self._commit, every_s)

    def _commit(self) -> None:
        self.log.submit(half_records(self.group, uuid.uuid4().hex, [Message("IDLE_LOGS", b"busy")])).result()
        self.commits += 1


def make_lakehouse(root: str, storage: dict, groups: list[str]) -> None:
    """The lakehouse at ``root``, made straight (no proxy), with each group's commit log (its version 0)."""
    lakehouse = Lakehouse(root, storage)
    init_lakehouse(lakehouse)
    with ThreadPoolExecutor(16) as makers:
        list(makers.map(lambda group: create_table(COMMIT_LOG, lakehouse.commit_log(group), storage), groups))


def measure(store, root: str, groups: list[str], busy: list[str], args) -> tuple[dict, Source, contextlib.ExitStack]:
    """Start the source and the busy writers of ``busy`` on ``root`` (which holds ``groups``), warm up (at least
    ``--warmup-s``; past the quiet time, until every idle group sleeps), count the checker's requests for
    ``--seconds``; return the figures and what runs (left running, for the wakes)."""
    running = contextlib.ExitStack()
    source = Source(Lakehouse(root, store.storage("checker")), args.trigger_ms / 1000)
    running.enter_context(source.following)
    writers = [BusyWriter(Lakehouse(root, store.storage("producer")), group, args.commit_every_ms / 1000)
               for group in busy]
    for writer in writers:
        running.callback(writer.log.close)
        running.enter_context(writer.writing)

    def commits() -> int:
        return sum(writer.commits for writer in writers)

    time.sleep(args.warmup_s)
    if source.reader.watch is not None and args.warmup_s >= QUIET_AFTER_S:  # until every idle group sleeps
        support.wait_until(lambda: len(source.reader.watch.asleep()) >= len(groups) - len(busy), 600,
                           "the idle groups to fall asleep", poll_s=0.5)
    before, triggers, committed, started = store.counts("checker"), source.triggers, commits(), time.monotonic()
    time.sleep(args.seconds)
    requests = store.requests_since("checker", before)
    elapsed = time.monotonic() - started
    figures = {"checker_requests": requests, "requests_per_s": round(requests["total"] / elapsed, 1),
               "triggers": source.triggers - triggers,
               "requests_per_trigger": round(requests["total"] / max(1, source.triggers - triggers), 2),
               "busy_commits_per_s": round((commits() - committed) / elapsed, 1),
               "asleep_groups": len(source.reader.watch.asleep()) if source.reader.watch is not None else None}
    return figures, source, running


def wake(store, root: str, source: Source, group: str, timeout_s: float = 30.0) -> float:
    """Append one record to idle ``group`` as its producer would; seconds from the commit's landing to the
    source's offset covering it."""
    log = f"groups/{group}/commit_log"
    with CommitLogWriter(Lakehouse(root, store.storage("producer")), group) as writer:
        version = writer.submit(half_records(group, uuid.uuid4().hex, [Message("IDLE_LOGS", b"woke")])).result()
        landed = time.monotonic()
        while not source.covers(log, version):
            if time.monotonic() - landed > timeout_s:
                return float("inf")
            time.sleep(0.01)
        return round(time.monotonic() - landed, 3)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=10, help="busy groups, each with a writer of its own")
    parser.add_argument("--idle", type=int, default=1000, help="idle groups of lakehouse *mixed*")
    parser.add_argument("--commit-every-ms", type=float, default=200.0, help="each busy writer's pause between commits")
    parser.add_argument("--trigger-ms", type=float, default=100.0, help="the pause between two reads of the source")
    parser.add_argument("--warmup-s", type=float, default=QUIET_AFTER_S + 5, help="before counting: idle groups sleep")
    parser.add_argument("--seconds", type=float, default=30.0, help="requests counted this long on each lakehouse")
    parser.add_argument("--wakes", type=int, default=5, help="long-idle groups given a record, one after another")
    parser.add_argument("--storage-latency-ms", type=float, default=25.0, help=support.LATENCY_HELP)
    parser.add_argument("--results", default=None)
    args = harness.parse_args(parser, argv, "idle_logs", TINY)
    results = Path(args.results or harness.RESULTS / f"idle-logs-s3-{args.storage_latency_ms:g}ms.json")
    report = harness.start_report("idle_logs", vars(args))
    busy = [f"busy-{index:02d}" for index in range(args.busy)]
    idle = [f"idle-{index:04d}" for index in range(args.idle)]
    workdir = tempfile.mkdtemp(prefix="bench-idle-logs-")
    try:
        with support.LatencyStore(args.storage_latency_ms, workdir) as store:
            report["storage"] = store.settings()
            roots = {"busy": store.new_root(), "mixed": store.new_root()}
            make_lakehouse(roots["busy"], store.direct, busy)
            made = time.monotonic()
            make_lakehouse(roots["mixed"], store.direct, busy + idle)
            print(f"{args.busy} busy groups; lakehouse mixed also {args.idle} idle ones (made in "
                  f"{time.monotonic() - made:.1f} s)", flush=True)
            figures, groups = {}, {"busy": busy, "mixed": busy + idle}
            for name in ("busy", "mixed"):
                figures[name], source, running = measure(store, roots[name], groups[name], busy, args)
                with running:
                    print(f"  {name:>5}: {figures[name]['requests_per_s']} requests a second, "
                          f"{figures[name]['requests_per_trigger']} a trigger ({figures[name]['triggers']} triggers), "
                          f"{figures[name]['asleep_groups']} groups asleep", flush=True)
                    if name == "mixed":
                        found = [wake(store, roots[name], source, group) for group in idle[:args.wakes]]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = round(figures["mixed"]["requests_per_s"] / figures["busy"]["requests_per_s"], 2)
    report.update(figures, ratio=ratio, target_ratio=TARGET_RATIO, found_after_s=found,
                  found_after_s_median=statistics.median(found), found_after_s_max=max(found),
                  target_found_s=TARGET_FOUND_S,
                  within_target=ratio <= TARGET_RATIO and max(found) <= TARGET_FOUND_S)
    print(f"requests a second, mixed / busy alone: {ratio} (target at most {TARGET_RATIO}); a long-idle group's "
          f"record found after {found} s (target at most {TARGET_FOUND_S} s): "
          f"{'met' if report['within_target'] else 'MISSED'}")
    return harness.finish_report(report, results)


if __name__ == "__main__":
    main()
