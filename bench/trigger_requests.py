"""Where a checker trigger's time goes on object storage: its requests, in sequence, by part.

Reads the per-request log of the checker's storage proxy (``coordinator/conformance/faults.py --request-log``,
written by ``bench/e2e.py --storage-latency-ms N --request-log DIR``) and the e2e report's idle and
sending windows. Each trigger that ran a micro-batch is found by its checkpoint writes: it starts with
the source's listing of ``groups/`` that precedes its ``offsets/<N>`` write and ends with the last
request of its ``commits/<N>`` write. Every request that starts within it is put in a part by its
path (:func:`part_of`); a part's **wall time** is the time at least one of its requests was in flight
(requests read side by side count once), so with N ms a request, wall time / N is the part's
requests *in sequence*. The parts marked ``(beside)`` run on other threads (the metrics listener,
Spark's log purge, the lease's own renewal) and are not on the trigger's path.

Example::

    python -m bench.e2e --storage-latency-ms 25 --rate 100 --seconds 60 --threads 32 \\
        --reference-producer-seconds 0 --idle-seconds 30 --drain 120 --request-log /tmp/requests
    python -m bench.trigger_requests /tmp/requests/checker-requests.jsonl bench/results/e2e-s3-25ms.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple, Optional

__all__ = ["Request", "Trigger", "part_of", "read_log", "summarize", "triggers"]

_CHECKPOINT = re.compile(r"/system/_checkpoints/checker/(offsets|commits)/\.?(\d+)")
_DELTA_TABLE = re.compile(r"/((?:system|topics)/[^/?]+|groups/[^/]+/check_requests)/")
#: Parts that run beside a trigger (other threads), not in its sequence.
BESIDE = ("metrics table (beside)", "checkpoint purge (beside)")


class Request(NamedTuple):
    start: float
    end: float
    method: str
    kind: str
    path: str
    status: object


def read_log(path: str) -> list[Request]:
    """The proxy's request log, in order of start."""
    with open(path) as lines:
        return sorted(Request(**{name: raw[name] for name in Request._fields})
                      for raw in (json.loads(line) for line in lines if line.strip()))


def part_of(request: Request, batch: Optional[int] = None) -> str:
    """What issued ``request``, told from its path (the checker's own files, its Spark checkpoint, the
    commit logs and the tables it appends to); within trigger ``batch``, a checkpoint file of an older
    batch is Spark's purge of old entries."""
    path, kind = request.path, request.kind
    if "/system/_checkpoints/checker/" in path:
        match = _CHECKPOINT.search(path)
        if match is not None:
            if batch is not None and int(match.group(2)) < batch - 1:
                return "checkpoint purge (beside)"
            return f"checkpoint {match.group(1)}/N"
        listed = re.search(r"/_checkpoints/checker/(offsets|commits)", path)
        return f"checkpoint {listed.group(1)}/N" if listed else "checkpoint: other"
    if "_checker_lease.json" in path or "_checker_standbys" in path:
        return "lease"
    if "_checker_progress.json" in path:
        return "progress record"
    if "_layout.json" in path or "/system/commit_log/" in path:
        return "layout (system/_layout.json, shared log)"
    if kind == "LIST" and re.search(r"prefix=[^&]*/groups/(&|$)", path):
        return "source: list groups/"
    if re.search(r"/commit_log(\.\d+)?/", path):
        if kind == "HEAD":
            return "source: probe next versions"
        return "segment: commit files" if re.search(r"/_delta_log/\d+\.json$", path) else "segment: data files"
    if "/instances" in path:
        return "producer instances"
    table = _DELTA_TABLE.search(path) or re.search(r"prefix=[^&]*?/((?:system|topics)/[^/&]+|groups/[^/]+/check_requests)",
                                                   path)
    if table is not None:
        name = re.sub(r"^groups/[^/]+/", "groups/*/", table.group(1))
        if name == "system/metrics":
            return "metrics table (beside)"
        if path.endswith("/_delta_log/_last_checkpoint"):
            return f"{name}: _last_checkpoint"
        return f"{name}: append"
    return "other"


class Trigger(NamedTuple):
    batch: int
    start: float
    end: float
    requests: list[Request]


def triggers(requests: list[Request]) -> list[Trigger]:
    """Each trigger that ran a micro-batch (see the module's documentation), in order."""
    first_offset, last_commit, newest = {}, {}, -1
    for index, request in enumerate(requests):
        match = _CHECKPOINT.search(request.path)
        if match is None:
            continue
        batch = int(match.group(2))
        if batch < newest - 1:  # Spark's purge of old entries, long after their trigger
            continue
        newest = max(newest, batch)
        if match.group(1) == "offsets":
            first_offset.setdefault(batch, index)
        else:
            last_commit[batch] = max(last_commit.get(batch, request.end), request.end)
    found = []
    for batch, index in sorted(first_offset.items()):
        if batch not in last_commit:
            continue
        listing = next((r for r in reversed(requests[:index]) if part_of(r) == "source: list groups/"), None)
        start = requests[index].start if listing is None else listing.start
        end = last_commit[batch]
        found.append(Trigger(batch, start, end, [r for r in requests if start <= r.start <= end]))
    return found


def _wall(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds at least one of ``intervals`` covers."""
    covered, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            covered += end - start
            reach = end
        elif end > reach:
            covered += end - reach
            reach = end
    return covered


def summarize(found: list[Trigger], since: float, until: float) -> Optional[dict]:
    """Means over the triggers that started within ``[since, until]``: requests and wall ms by part, the
    trigger's wall time, and the time its own requests (the parts not beside it) were in flight."""
    chosen = [trigger for trigger in found if since <= trigger.start <= until]
    if not chosen:
        return None
    parts: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"requests": [], "wall_ms": []})
    names = sorted({part_of(r, trigger.batch) for trigger in chosen for r in trigger.requests})
    on_path_ms, total_ms, on_path_requests = [], [], []
    for trigger in chosen:
        by_part = defaultdict(list)
        for request in trigger.requests:
            by_part[part_of(request, trigger.batch)].append(request)
        for name in names:
            parts[name]["requests"].append(len(by_part[name]))
            parts[name]["wall_ms"].append(_wall((r.start, r.end) for r in by_part[name]) * 1000)
        on_path = [r for r in trigger.requests if part_of(r, trigger.batch) not in BESIDE]
        on_path_requests.append(len(on_path))
        on_path_ms.append(_wall((r.start, r.end) for r in on_path) * 1000)
        total_ms.append((trigger.end - trigger.start) * 1000)
    return {"triggers": len(chosen),
            "trigger_ms_mean": round(statistics.fmean(total_ms), 1),
            "trigger_ms_p50": round(statistics.median(total_ms), 1),
            "requests_on_path_mean": round(statistics.fmean(on_path_requests), 1),
            "requests_in_flight_ms_mean": round(statistics.fmean(on_path_ms), 1),
            "parts": {name: {"requests": round(statistics.fmean(values["requests"]), 2),
                             "wall_ms": round(statistics.fmean(values["wall_ms"]), 1)}
                      for name, values in sorted(parts.items())}}


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the checker's proxy request log (DIR/checker-requests.jsonl)")
    parser.add_argument("report", help="the e2e report of the same run (its windows_wall: idle, sending)")
    parser.add_argument("--results", default=None, help="write the summary here as JSON")
    args = parser.parse_args(argv)
    windows: Mapping[str, list[float]] = json.loads(Path(args.report).read_text())["windows_wall"]
    found = triggers(read_log(args.log))
    summary = {window: summarize(found, *span) for window, span in windows.items()}
    for window, figures in summary.items():
        if figures is None:
            print(f"{window}: no trigger with a batch")
            continue
        print(f"{window}: {figures['triggers']} triggers, mean {figures['trigger_ms_mean']} ms (p50 "
              f"{figures['trigger_ms_p50']}); {figures['requests_on_path_mean']} requests of its own, in flight "
              f"{figures['requests_in_flight_ms_mean']} ms")
        for name, part in figures["parts"].items():
            print(f"  {name:<48} {part['requests']:>7} requests {part['wall_ms']:>8} ms")
    if args.results:
        Path(args.results).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    main()
    sys.exit(0)
