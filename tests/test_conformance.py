"""The conformance kit (docs/protocol.md#the-conformance-kit): the Python producer's driver answers the line
protocol, and the kit, run against it with a real checker, passes every case."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

from coordinator.lakehouse import Lakehouse, init_lakehouse

DRIVER = [sys.executable, "-m", "coordinator.conformance.python_client"]


def drive(ops: list[dict], cwd) -> tuple[list[dict], int]:
    """Run the driver over ``ops`` (a garbage line second); its stdout's JSON lines and its exit code."""
    lines = [json.dumps(ops[0]), "not json", *map(json.dumps, ops[1:])]
    done = subprocess.run(DRIVER, input="\n".join(lines) + "\n", capture_output=True, text=True, cwd=cwd, timeout=120)
    return [json.loads(line) for line in done.stdout.splitlines()], done.returncode


def test_the_python_driver_answers_each_op_of_the_line_protocol(tmp_path):
    lakehouse = Lakehouse(str(tmp_path / "lakehouse"))
    init_lakehouse(lakehouse)
    config = tmp_path / "coordinator.toml"
    config.write_text(f"lakehouse = {json.dumps(lakehouse.root)}\n")
    body = base64.b64encode(b"hello").decode()
    message = {"topic": "T", "body": body, "keys": "k1", "tags": None, "properties": {"p": "v"}}
    replies, code = drive([
        {"op": "frobnicate"},
        {"op": "start", "config": str(config), "group": "g"},
        {"op": "send", "request": "r1", "messages": [message, message | {"topic": "U"}], "local_state": "ROLLBACK_MESSAGE",
         "check_state": "COMMIT_MESSAGE"},
        {"op": "send", "request": "r2", "messages": [message | {"topic": "a/../b"}], "local_state": "COMMIT_MESSAGE",
         "check_state": "UNKNOW"},
        {"op": "answer", "transaction_id": "t", "state": "COMMIT_MESSAGE"},
        {"op": "stop"},
    ], tmp_path)

    assert code == 0
    unknown, garbage, started, sent, refused, answered, stopped = replies
    assert unknown == {"reply": "frobnicate", "ok": False, "error": "UnknownOp", "message": "unknown op 'frobnicate'"}
    assert garbage["ok"] is False and garbage["error"] == "BadRequest"
    assert started["reply"] == "start" and started["ok"] and len(started["instance_id"]) == 32
    assert sent | {"transaction_id": None, "msg_ids": None} == {
        "reply": "send", "request": "r1", "ok": True, "send_status": "SEND_OK", "transaction_id": None,
        "msg_ids": None, "local_state": "ROLLBACK_MESSAGE"}
    assert refused | {"message": None} == {"reply": "send", "request": "r2", "ok": False,
                                           "error": "MessageValidationError", "retriable": False, "message": None}
    assert (answered, stopped) == ({"reply": "answer", "ok": True}, {"reply": "stop", "ok": True})
    rows = lakehouse.read("groups/g/commit_log").to_pylist()
    halves = sorted((r["topic"], r["msg_id"]) for r in rows if r["kind"] == "HALF")
    assert halves == sorted(zip(["T", "U"], sent["msg_ids"]))
    assert {r["transaction_id"] for r in rows} == {sent["transaction_id"]}
    assert [r["state"] for r in rows if r["kind"] == "END"] == ["ROLLBACK_MESSAGE"]
    assert {r["body"] for r in rows if r["kind"] == "HALF"} == {b"hello"}
