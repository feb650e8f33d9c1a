"""``bench/trigger_requests.py``: a checker trigger found in its proxy's request log by its checkpoint writes,
and its requests put in parts, requests read side by side counting once in a part's wall time."""

from __future__ import annotations

import json

from bench.trigger_requests import Request, part_of, read_log, summarize, triggers

ROOT = "/bench/lh"


def request(start_ms: float, end_ms: float, method: str, kind: str, path: str) -> Request:
    return Request(start_ms / 1000, end_ms / 1000, method, kind, path, 200)


def test_a_trigger_runs_from_its_listing_to_its_commit_and_its_requests_are_told_apart(tmp_path):
    log = [
        request(0, 25, "GET", "LIST", "/bench?delimiter=/&list-type=2&prefix=lh/groups/"),  # a trigger with no batch
        request(100, 125, "GET", "LIST", "/bench?delimiter=/&list-type=2&prefix=lh/groups/"),
        request(125, 150, "HEAD", "HEAD", f"{ROOT}/groups/g/commit_log/_delta_log/00000000000000000007.json"),
        request(150, 175, "PUT", "PUT", f"{ROOT}/system/_checkpoints/checker/offsets/.5.ab12.tmp"),
        request(175, 200, "PUT", "COPY", f"{ROOT}/system/_checkpoints/checker/offsets/5"),
        request(200, 225, "GET", "GET", f"{ROOT}/groups/g/commit_log/_delta_log/00000000000000000006.json"),
        request(210, 235, "GET", "GET", f"{ROOT}/groups/g/commit_log/_delta_log/00000000000000000005.json"),
        request(240, 265, "GET", "GET", f"{ROOT}/groups/g/commit_log/part-0001.parquet"),
        request(265, 290, "PUT", "PUT", f"{ROOT}/system/_checker_progress.json"),
        request(290, 315, "GET", "GET", f"{ROOT}/system/op/_delta_log/_last_checkpoint"),
        request(300, 330, "PUT", "PUT", f"{ROOT}/system/metrics/_delta_log/00000000000000000009.json"),
        request(315, 340, "PUT", "PUT", f"{ROOT}/system/op/_delta_log/00000000000000000003.json"),
        request(340, 365, "DELETE", "DELETE", f"{ROOT}/system/_checkpoints/checker/offsets/1"),
        request(345, 370, "PUT", "COPY", f"{ROOT}/system/_checkpoints/checker/commits/5"),
        request(400, 425, "GET", "LIST", "/bench?delimiter=/&list-type=2&prefix=lh/groups/"),  # the next trigger's
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r._asdict()) + "\n" for r in reversed(log)))
    found = triggers(read_log(str(path)))
    assert [(t.batch, round(t.start * 1000), round(t.end * 1000), len(t.requests)) for t in found] == [(5, 100, 370, 13)]
    parts = [part_of(r, 5) for r in found[0].requests]
    assert parts == ["source: list groups/", "source: probe next versions", "checkpoint offsets/N", "checkpoint offsets/N",
                     "segment: commit files", "segment: commit files", "segment: data files", "progress record",
                     "system/op: _last_checkpoint", "metrics table (beside)", "system/op: append",
                     "checkpoint purge (beside)", "checkpoint commits/N"]
    summary = summarize(found, 0.0, 1.0)
    assert summary["triggers"] == 1 and summary["trigger_ms_mean"] == 270.0
    assert summary["parts"]["segment: commit files"] == {"requests": 2, "wall_ms": 35.0}  # side by side: once
    assert summary["requests_on_path_mean"] == 11
    assert summarize(found, 0.5, 1.0) is None


def test_spark_purging_an_old_batchs_checkpoint_files_does_not_stretch_that_batchs_trigger(tmp_path):
    checkpoint = f"{ROOT}/system/_checkpoints/checker"
    log = [
        request(0, 25, "GET", "LIST", "/bench?delimiter=/&list-type=2&prefix=lh/groups/"),
        request(25, 50, "PUT", "PUT", f"{checkpoint}/offsets/3"),  # written in place: one PUT each
        request(50, 75, "PUT", "PUT", f"{checkpoint}/commits/3"),
        request(100, 125, "GET", "LIST", "/bench?delimiter=/&list-type=2&prefix=lh/groups/"),
        request(125, 150, "PUT", "PUT", f"{checkpoint}/offsets/4"),
        request(150, 175, "PUT", "PUT", f"{checkpoint}/commits/4"),
        request(200, 225, "GET", "LIST", "/bench?delimiter=/&list-type=2&prefix=lh/groups/"),
        request(225, 250, "PUT", "PUT", f"{checkpoint}/offsets/5"),
        request(250, 275, "DELETE", "DELETE", f"{checkpoint}/commits/3"),  # Spark's purge, two batches on
        request(275, 300, "PUT", "PUT", f"{checkpoint}/commits/5"),
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r._asdict()) + "\n" for r in log))
    found = triggers(read_log(str(path)))
    assert [(t.batch, round(t.start * 1000), round(t.end * 1000)) for t in found] == [(3, 0, 75), (4, 100, 175), (5, 200, 300)]
