"""Spark's streaming checkpoint on object storage at a chosen latency: the requests and the time of a
micro-batch's checkpoint, for each checkpoint file manager the checker can use.

One Spark session (txcoord's, with the S3A settings of ``[storage]``) runs a throwaway query for each manager in
turn: a rate source of one row a second, a trigger every second, ``foreachBatch`` doing nothing, its checkpoint
on the loopback S3 server behind the fault proxy. The micro-batches that run in the ``--seconds`` after
``--warmup`` are counted (not the newest, which the stop may cut short): their requests for the checkpoint's
offsets and commits, from the proxy's request log, and Spark's own timings: ``walCommit`` (writing
``offsets/N``), ``commitOffsets`` (writing ``commits/N``) and the whole trigger. The managers:

- ``rename``: Spark's default, a temporary file renamed (on S3 a copy and a delete);
- ``abortable``: Spark's ``AbortableStreamBasedCheckpointFileManager`` (``spark-hadoop-cloud``);
- ``conditional``: txcoord's ``ConditionalPutCheckpointFileManager``, one conditional PUT a file.

    python -m bench.checkpoint_requests --storage-latency-ms 25
    python -m bench.checkpoint_requests --tiny                        # the smallest run, for the tests

Prints the figures and writes ``bench/results/checkpoint-requests-s3-<N>ms.json`` (``--results`` to change),
each manager's figures beside the default's as ratios.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from bench import harness

import support
from coordinator.conformance.faults import REQUEST_KINDS

from coordinator.spark.own_classes import CONDITIONAL_PUT_CHECKPOINT_MANAGER
from coordinator.spark.session import CHECKPOINT_MANAGER_SETTING, IN_PLACE_CHECKPOINT_MANAGERS, get_spark, object_store_conf

MANAGERS = {"rename": None, "abortable": IN_PLACE_CHECKPOINT_MANAGERS[1], "conditional": CONDITIONAL_PUT_CHECKPOINT_MANAGER}
TINY = {"storage_latency_ms": 5.0, "seconds": 3.0, "warmup": 4.0}
#: How long past ``--seconds`` to wait for two micro-batches (a loaded machine's triggers take longer).
_WHOLE_BATCH_TIMEOUT_S = 120.0
#: Spark's timings kept of each counted micro-batch.
_TIMINGS = ("walCommit", "commitOffsets", "triggerExecution")


def measure(spark, store: support.LatencyStore, manager: Optional[str], warmup_s: float, seconds: float) -> dict:
    """Run the throwaway query with ``manager`` (None: Spark's default) and return its figures: the requests
    of the micro-batches that ran in the counted window for their checkpoint files, from the proxy's log."""
    if manager is None:
        spark.conf.unset(CHECKPOINT_MANAGER_SETTING)
    else:
        spark.conf.set(CHECKPOINT_MANAGER_SETTING, manager)
    root = store.new_root()
    batches: list[int] = []
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream
             .foreachBatch(lambda frame, batch_id: batches.append(batch_id))
             .option("checkpointLocation", f"{root}/checkpoint")
             .trigger(processingTime="1 second").start())
    try:
        time.sleep(warmup_s)
        first = len(batches)
        time.sleep(seconds)
        deadline = time.monotonic() + _WHOLE_BATCH_TIMEOUT_S
        while len(batches) - first < 2:  # at least one whole micro-batch counted, on a slow machine too
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than 2 micro-batches in {seconds + _WHOLE_BATCH_TIMEOUT_S:g} s")
            time.sleep(0.1)
        counted = set(batches[first:-1])  # not the newest: the stop may cut its checkpoint short
    finally:
        query.stop()
        spark.conf.unset(CHECKPOINT_MANAGER_SETTING)
    # Every request for the checkpoint's offsets and commits (a path, or a listing's prefix parameter) from the
    # first one naming a counted batch to the last: those naming one, and the checks of their directories between.
    log_of_checkpoint = re.compile(rf"{root.split('/')[-1]}/checkpoint/(?:offsets|commits)(?:/\.?(\d+))?")
    with open(store.request_log("checker")) as log:
        found = [(request, log_of_checkpoint.search(request["path"])) for request in map(json.loads, log)]
    found = [(request, match.group(1)) for request, match in found if match is not None]
    naming = [request["start"] for request, batch in found if batch is not None and int(batch) in counted]
    requests = Counter(request["kind"] for request, _ in found if naming and min(naming) <= request["start"] <= max(naming))
    progress = [p["durationMs"] for p in query.recentProgress if p["batchId"] in counted]
    per_batch = {kind: round(requests[kind] / len(counted), 1) for kind in REQUEST_KINDS} if counted else {}
    return {"manager": manager or "Spark's default (rename)", "micro_batches": len(counted),
            "requests_per_micro_batch": per_batch | {"total": round(sum(requests.values()) / len(counted), 1) if counted else None},
            **{f"{timing}_ms": {"p50": harness.median([p.get(timing, 0) for p in progress]),
                                "max": max((p.get(timing, 0) for p in progress), default=None)} for timing in _TIMINGS}}


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage-latency-ms", type=float, default=25.0, help=support.LATENCY_HELP)
    parser.add_argument("--seconds", type=float, default=20.0, help="counted, per manager")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds before counting, per manager")
    parser.add_argument("--results", default=None)
    args = harness.parse_args(parser, argv, "checkpoint_requests", TINY)
    results = Path(args.results or harness.RESULTS / f"checkpoint-requests-s3-{args.storage_latency_ms:g}ms.json")
    report = harness.start_report("checkpoint_requests", vars(args))
    with tempfile.TemporaryDirectory() as workdir, support.LatencyStore(args.storage_latency_ms, workdir, parties=("checker",),
                                                                        request_logs=workdir) as store:
        report["storage"] = store.settings()
        spark = get_spark("bench-checkpoint-requests", object_store_conf(store.storage("checker")))
        try:
            report["managers"] = {name: measure(spark, store, manager, args.warmup, args.seconds)
                                  for name, manager in MANAGERS.items()}
        finally:
            spark.stop()
    reference = report["managers"]["rename"]
    for name, figures in report["managers"].items():
        ratio = figures["triggerExecution_ms"]["p50"] / reference["triggerExecution_ms"]["p50"]
        figures["trigger_over_rename"] = round(ratio, 2)
        print(f"{name:>12}: {figures['requests_per_micro_batch']['total']:5.1f} requests a micro-batch; "
              f"walCommit p50 {figures['walCommit_ms']['p50']} ms, commitOffsets p50 {figures['commitOffsets_ms']['p50']} ms, "
              f"trigger p50 {figures['triggerExecution_ms']['p50']} ms ({ratio:.2f}x the default's)", flush=True)
    return harness.finish_report(report, results)


if __name__ == "__main__":
    main()
