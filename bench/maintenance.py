"""One maintenance run of a busy commit log on object storage, this tree against a reference commit.

A group's commit log of ``--versions`` one-transaction versions, written straight to the S3 server by a
producer's writer (which checkpoints it every ``--checkpoint-every`` versions: 1,000 in production, so the
default 1,900 leaves 900 commits since its last checkpoint, as a busy log has between two runs) and read by
a checker up to its head (a progress record says so), is maintained once
(``coordinator.ops.maintenance.maintain``: what ``txcoord maintain`` and the checker's schedule run)
through a proxy adding ``--storage-latency-ms`` to every request. Reported for each tree: the run's
seconds, its requests by kind, and its GETs of commit files (``_delta_log/<N>.json``).
Each tree (this checkout, and a git worktree of ``--reference-commit``) maintains a log of its own,
written the same way, in a process of its own with its own code first on ``PYTHONPATH``; the ratios are
this tree's over the reference's.

    python -m bench.maintenance --storage-latency-ms 25 --reference-commit caa078b
    python -m bench.maintenance --tiny       # 40 versions, a checkpoint at 25, at 5 ms, against HEAD (bench/tests/test_bench.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
GROUP = "bench-maintenance"
#: The reference: main before maintenance shared the commits its check read with its first checkpoint.
REFERENCE_COMMIT = "caa078b"
TINY = {"versions": 40, "checkpoint_every": 25, "storage_latency_ms": 5, "reference_commit": "HEAD"}
_COMMIT_FILE = re.compile(r"/_delta_log/\d{20}\.json$")


def maintain_side(root: str, storage: dict) -> dict:
    """Inside a tree (its code first on ``sys.path``): maintain the group's commit log once; its result."""
    from coordinator.lakehouse import Lakehouse
    from coordinator.ops.maintenance import maintain

    lakehouse = Lakehouse(root, storage)
    started = time.monotonic()
    (result,) = maintain(lakehouse, tables=[f"groups/{GROUP}/commit_log"])
    return {"seconds": round(time.monotonic() - started, 3), "failed": result.failed, "skipped": result.skipped,
            "version": result.version}


def write_log(store, versions: int, checkpoint_every: int) -> str:
    """A new lakehouse on ``store`` whose group's commit log holds ``versions`` versions, checkpointed by its
    writer every ``checkpoint_every``; its root."""
    from coordinator.lakehouse import create_group_tables
    from coordinator.producer.commit_log import CommitLogWriter, half_records
    from coordinator.producer.message import Message
    from coordinator.tables import COMMIT_LOG

    lakehouse = store.new_lakehouse()
    create_group_tables(lakehouse, GROUP)
    if str(checkpoint_every) != COMMIT_LOG.properties["delta.checkpointInterval"]:  # the run sets it back
        lakehouse.table(f"groups/{GROUP}/commit_log").alter.set_table_properties(
            {"delta.checkpointInterval": str(checkpoint_every)})
    with CommitLogWriter(lakehouse, GROUP) as writer:
        for _ in range(versions):
            writer.submit(half_records(GROUP, uuid.uuid4().hex, [Message("T", b"x")])).result()
    checker_read_all(lakehouse, versions)
    return lakehouse.root


def checker_read_all(lakehouse, versions: int) -> None:
    """Record a checker that has read the log's ``versions`` versions, as a checker keeping up has (without
    one, maintenance's guards read the log's whole history, every commit a request)."""
    from coordinator.control.progress import BatchRecord, CheckerProgress, Epoch, Progress

    log = f"groups/{GROUP}/commit_log"
    store = CheckerProgress(lakehouse)
    store.load()
    store.save(Progress(Epoch(number=0, first_batch_id=0, starting_versions={}, checkpoint_id="bench"),
                        BatchRecord(1, 1, starts={log: versions - 1}, ends={log: versions}, now_us=0)))


def commit_file_gets(request_log: str, offset: int) -> int:
    """GETs of commit files the proxy logged after byte ``offset`` of its request log."""
    with open(request_log, "rb") as log:
        log.seek(offset)
        requests = [json.loads(line) for line in log if line.strip()]
    return sum(1 for request in requests if request["kind"] == "GET" and _COMMIT_FILE.search(request["path"]))


def measure(tree, store, args, workdir: str) -> dict:
    """Write a log, then maintain it in ``tree``'s process through the proxy; the run's figures."""
    root = write_log(store, args.versions, args.checkpoint_every)
    request_log = store.request_log("maintenance")
    offset = os.path.getsize(request_log) if os.path.exists(request_log) else 0
    before = store.counts("maintenance")
    where, out = os.path.join(workdir, f"{tree.name}-store.json"), os.path.join(workdir, f"{tree.name}-side.json")
    Path(where).write_text(json.dumps({"root": root, "storage": store.storage("maintenance")}))
    tree.run([str(HERE / "maintenance.py"), "--side", str(tree.root), "--object-store-json", where, "--side-results", out],
             timeout_s=1800)
    figures = json.loads(Path(out).read_text())
    requests = store.requests_since("maintenance", before)
    return {**figures, "commit": tree.commit, "requests": requests, "commit_file_gets": commit_file_gets(request_log, offset)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=1900, help="the commit log's versions")
    parser.add_argument("--checkpoint-every", type=int, default=1000,
                        help="the log's delta.checkpointInterval while it is written (the commit log's: 1000)")
    parser.add_argument("--storage-latency-ms", type=float, default=25, help="added to every request of the run")
    parser.add_argument("--reference-commit", default=REFERENCE_COMMIT)
    parser.add_argument("--results", default=None, help="default: bench/results/maintenance-s3-<N>ms.json")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # the tree one side runs in
    parser.add_argument("--object-store-json", help=argparse.SUPPRESS)
    parser.add_argument("--side-results", help=argparse.SUPPRESS)
    raw = parser.parse_known_args(argv)[0]
    if raw.side:
        sys.path[:0] = [raw.side]  # the side's own coordinator, imported nowhere before this
        where = json.loads(Path(raw.object_store_json).read_text())
        Path(raw.side_results).write_text(json.dumps(maintain_side(where["root"], where["storage"])))
        return {}

    from bench import harness

    import support
    from bench.drain import Tree, reference_tree, reference_worktree

    args = harness.parse_args(parser, argv, "maintenance", TINY)
    args.results = args.results or str(harness.RESULTS / f"maintenance-s3-{args.storage_latency_ms:g}ms.json")
    report = harness.start_report("maintenance", vars(args))
    with contextlib.ExitStack() as stack:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-maintenance-"))
        store = stack.enter_context(support.LatencyStore(args.storage_latency_ms, workdir, parties=("maintenance",),
                                                         request_logs=workdir))
        report["storage"] = store.settings()
        trees = [reference_tree(stack.enter_context(reference_worktree(args.reference_commit))), Tree("this", HERE.parent)]
        report["results"] = {}
        for tree in trees:
            print(f"{tree.name} ({tree.commit}): writing {args.versions} versions, then maintaining them...", flush=True)
            figures = report["results"][tree.name] = measure(tree, store, args, workdir)
            print(f"  {figures['seconds']} s, {figures['requests']['total']} requests ({figures['commit_file_gets']} GETs of "
                  f"commit files); failed: {figures['failed']}, skipped: {figures['skipped']}", flush=True)
    this, reference = report["results"]["this"], report["results"]["reference"]
    report["ratios"] = {key: round(this_value / reference_value, 3) if reference_value else None
                        for key, this_value, reference_value in (
                            ("seconds", this["seconds"], reference["seconds"]),
                            ("requests", this["requests"]["total"], reference["requests"]["total"]),
                            ("commit_file_gets", this["commit_file_gets"], reference["commit_file_gets"]))}
    print(f"this / reference: {report['ratios']}")
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
