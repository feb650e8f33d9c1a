"""The conformance kit (docs/protocol.md#the-conformance-kit): the Python producer's driver answers the line
protocol, and the kit, run against it with a real checker, passes every case."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from typing import Optional

import pytest

from coordinator.conformance.cases import CASES, OBJECT_STORE_CASES, SLOWEST, start_order
from coordinator.conformance.client import ClientProcess, Deadline
from coordinator.conformance.kit import run_cases
from coordinator.conformance.primitives import Run
from coordinator.exceptions import CaseFailedError
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
    assert refused | {"message": None} == {"reply": "send", "request": "r2", "ok": False, "error": "MessageValidationError",
                                           "retriable": False, "outcome_unknown": False, "message": None}
    assert (answered, stopped) == ({"reply": "answer", "ok": True}, {"reply": "stop", "ok": True})
    rows = lakehouse.read("groups/g/commit_log").to_pylist()
    halves = sorted((r["topic"], r["msg_id"]) for r in rows if r["kind"] == "HALF")
    assert halves == sorted(zip(["T", "U"], sent["msg_ids"]))
    assert {r["transaction_id"] for r in rows} == {sent["transaction_id"]}
    assert [r["state"] for r in rows if r["kind"] == "END"] == ["ROLLBACK_MESSAGE"]
    assert {r["body"] for r in rows if r["kind"] == "HALF"} == {b"hello"}


def conformance(*args: str, cwd, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordinator", "conformance", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=900, env=None if env is None else os.environ | env)


def case_lines(stdout: str) -> dict[str, str]:
    """The kit's verdicts: case name -> ``PASS`` or the ``FAIL`` line's reason."""
    verdicts = {}
    for line in stdout.splitlines():
        if line.startswith("PASS "):
            verdicts[line.split()[1]] = "PASS"
        elif line.startswith("FAIL "):
            name, _, reason = line[5:].partition(": ")
            verdicts[name] = reason
    return verdicts


@pytest.fixture(params=["python", "java"])
def client_options(request) -> list[str]:
    """The kit's options for the client under test: the Python producer's driver, or the Java client's
    (clients/java, built once per machine: support.java_client), four cases at once: every case at once starts
    13 JVMs, which two cores shared with the other tests' Spark jobs did not start in time."""
    if request.param == "python":
        return ["--producer", " ".join(DRIVER)]
    from support.java_client import JVM_OPTIONS, build_java_client, java_classpath

    reason = build_java_client()
    if reason:
        pytest.skip(reason)
    return ["--producer", f"java {' '.join(JVM_OPTIONS)} -cp '{java_classpath()}' io.txcoord.client.conformance.ConformanceDriver",
            "--parallel", "4"]


@pytest.mark.slow
def test_each_client_passes_every_case_of_the_kit(tmp_path, client_options):
    started = time.monotonic()
    done = conformance(*client_options, "--workdir", str(tmp_path / "kit"), cwd=tmp_path)
    print(f"the kit took {time.monotonic() - started:.0f} s")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert case_lines(done.stdout) == {name: "PASS" for name in CASES}
    assert re.fullmatch(rf"{len(CASES)} of {len(CASES)} cases passed in \d+ s", done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.object_store
def test_each_client_passes_every_case_of_the_kit_on_the_s3_server_with_the_grant_case(tmp_path, client_options):
    from support.servers import require_s3_server

    require_s3_server()
    started = time.monotonic()
    done = conformance(*client_options, "--object-store", "--workdir", str(tmp_path / "kit"), cwd=tmp_path)
    print(f"the kit on the S3 server took {time.monotonic() - started:.0f} s")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert case_lines(done.stdout) == {name: "PASS" for name in [*CASES, *OBJECT_STORE_CASES]}
    # The refusal came from the storage, at the first write as group B with group A's account.
    stderr = (tmp_path / "kit" / "grant" / "client-1" / "client.stderr").read_text()
    assert "AccessDeniedError" in stderr and "groups/conformance_grant_b/_producers/" in stderr


#: A client with four defects the kit must catch: it commits whatever its local transaction was told to return,
#: it takes its next version from what it knew, never reading _last_checkpoint, it creates its own commit log
#: but not the missing ones below it, and its commits name their protocol in a field no checker reads.
BROKEN_CLIENT = """
from concurrent.futures import Future

from coordinator.appender import DeltaAppender
from coordinator.conformance import python_client
from coordinator.producer import commit_log
from coordinator.protocol import LocalTransactionState


class Lying(python_client.ScriptedListener):
    def execute_local_transaction(self, msg, arg):
        super().execute_local_transaction(msg, arg)
        return LocalTransactionState.COMMIT_MESSAGE


def no_checkpoint_read(self):
    unread = Future()
    unread.set_result(None)
    return unread


def own_log_only(create, logs, remote):  # the logs below its own, then its own
    return created(create, logs[-1:], remote=remote)


python_client.ScriptedListener = Lying
DeltaAppender._read_last_checkpoint = no_checkpoint_read
created, commit_log.read_all = commit_log.read_all, own_log_only
commit_log.PROTOCOL_FIELD = "protocol"
raise SystemExit(python_client.main())
"""


@pytest.mark.slow
def test_the_kit_fails_a_client_that_commits_what_it_should_roll_back_writes_below_a_checkpoint_or_leaves_a_gap(
        tmp_path):
    script = tmp_path / "broken_client.py"
    script.write_text(BROKEN_CLIENT)
    done = conformance("--producer", f"{sys.executable} {script}", "--case", "commit", "--case", "rollback",
                       "--case", "checkpointed_log", "--case", "log_numbering", "--case", "protocol_version",
                       "--case-timeout", "30", "--workdir", str(tmp_path / "kit"), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    verdicts = case_lines(done.stdout)
    assert verdicts["commit"] == "PASS" and list(verdicts) == ["commit", "rollback", "checkpointed_log", "log_numbering",
                                                               "protocol_version"]
    assert verdicts["rollback"].startswith("send replied local_state 'COMMIT_MESSAGE', the listener returned "
                                           "ROLLBACK_MESSAGE"), verdicts
    # Its second send reported success; the checker never read the version it recreated below the checkpoint.
    assert verdicts["checkpointed_log"].startswith("timed out waiting for system/op to decide"), verdicts
    assert verdicts["log_numbering"].startswith("the client wrote its transaction ") and (
        "groups/conformance_log_numbering/commit_log, groups/conformance_log_numbering/commit_log.1 missing"
        in verdicts["log_numbering"]), verdicts
    assert verdicts["protocol_version"] == ("the client's commit(s) of groups/conformance_protocol_version/commit_log "
                                            "name(s) no client protocol 1: ['version 1: txcoordProtocol None', 'version 2: "
                                            "txcoordProtocol None'] (each commit's commitInfo says \"txcoordProtocol\": "
                                            "1, a JSON number)"), verdicts  # its half's commit, then its END's
    assert re.fullmatch(r"1 of 5 cases passed in \d+ s; failed: rollback, checkpointed_log, log_numbering, "
                        r"protocol_version", done.stdout.splitlines()[-1])


#: A client with a defect for each case of hostile storage, chosen by the group it starts as: it takes a create
#: refused on its retry for another writer's (lost_reply), a half whose commit never answered for stored
#: (throttled), and for not stored (unknown_outcome), and runs the local transaction of such a half all the same
#: (slow_reply).
BROKEN_ON_HOSTILE_STORAGE = """
from concurrent.futures import Future

from coordinator.conformance import python_client
from coordinator.exceptions import HalfOutcomeUnknownError, StorageUnavailableError, WriteOutcomeUnknownError
from coordinator.producer.commit_log import CommitLogWriter, end_record
from coordinator.producer.transaction_producer import TransactionProducer
from coordinator.storage import ObjectFileStore

submit, send = CommitLogWriter.submit, TransactionProducer._send


def unknown_as(outcome):
    def submitted(self, records):
        settled = Future()

        def settle(done):
            error = done.exception()
            if isinstance(error, WriteOutcomeUnknownError):
                outcome(settled)
            elif error is not None:
                settled.set_exception(error)
            else:
                settled.set_result(done.result())

        submit(self, records).add_done_callback(settle)
        return settled
    return submitted


def ran_anyway(self, msgs, listener_msg, arg):
    try:
        return send(self, msgs, listener_msg, arg)
    except HalfOutcomeUnknownError as error:
        state = self._execute_local_transaction(listener_msg, arg, error.transaction_id, {})
        self._writer.submit([end_record(self.group, error.transaction_id, state)])
        raise


DEFECTS = {
    "conformance_lost_reply": lambda: setattr(ObjectFileStore, "_own_write", lambda self, operation, key, data: None),
    "conformance_throttled": lambda: setattr(CommitLogWriter, "submit", unknown_as(lambda f: f.set_result(-1))),
    "conformance_unknown_outcome": lambda: setattr(CommitLogWriter, "submit", unknown_as(
        lambda f: f.set_exception(StorageUnavailableError("taken for not stored")))),
    "conformance_slow_reply": lambda: setattr(TransactionProducer, "_send", ran_anyway),
}
start = python_client.Driver._start


def started_with_a_defect(self, op):
    DEFECTS[op["group"]]()
    return start(self, op)


python_client.Driver._start = started_with_a_defect
raise SystemExit(python_client.main())
"""


@pytest.mark.slow
@pytest.mark.object_store
def test_the_kit_fails_a_client_that_guesses_what_became_of_a_half_the_storage_never_confirmed(tmp_path):
    from support.servers import require_s3_server

    require_s3_server()
    script = tmp_path / "broken_client.py"
    script.write_text(BROKEN_ON_HOSTILE_STORAGE)
    faults = ["lost_reply", "throttled", "unknown_outcome", "slow_reply"]
    done = conformance("--producer", f"{sys.executable} {script}", "--object-store", *(f"--case={c}" for c in faults),
                       "--case-timeout", "60", "--workdir", str(tmp_path / "kit"), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    verdicts = case_lines(done.stdout)
    assert list(verdicts) == faults, done.stdout
    # It committed its half again at the next version: the checker refused the copy.
    assert verdicts["lost_reply"].startswith("system/rejected holds [(") and "'duplicate transaction_id')]" in \
        verdicts["lost_reply"], verdicts
    # Past the bound nothing was stored: its SEND_OK (and its END) stand for a message never delivered.
    assert re.match(r"the client replied SEND_OK for \w+, yet timed out waiting for system/op to decide",
                    verdicts["throttled"]), verdicts
    assert verdicts["unknown_outcome"].startswith("the client replied {'ok': False, 'error': 'HalfNotStoredError', "
                                                  "'retriable': True, 'outcome_unknown': False}, which says the half "
                                                  "was not stored, yet the checker accepted ['"), verdicts
    # The half landed while it waited, and it gave up only past its timeouts: its own END came after the immunity,
    # refused, and the check rolled the half back; its END in its log says it ran the local transaction all the same.
    assert re.match(r"the client's commit log holds its own END of \['\w+'\], a send it did not reply SEND_OK to: it "
                    r"ran the local transaction of a half it was not told is durable", verdicts["slow_reply"]), verdicts


def test_an_unknown_case_is_a_usage_error_before_any_checker_starts(tmp_path):
    done = conformance("--producer", "true", "--case", "no_such_case", "--workdir", str(tmp_path / "kit"), cwd=tmp_path)
    assert done.returncode == 2
    assert "no case no_such_case; the cases: commit, rollback" in done.stderr
    assert not (tmp_path / "kit").exists()
    assert conformance("--producer", "true", "--case", "grant", cwd=tmp_path).stderr.endswith(
        "case(s) grant need --object-store\n")
    listed = conformance("--list", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.split()[:len(CASES)] == list(CASES)


def test_object_store_says_what_to_run_when_its_s3_server_is_not_built(tmp_path):
    done = conformance("--producer", "true", "--object-store", "--workdir", str(tmp_path / "kit"), cwd=tmp_path,
                       env={"TXCOORD_CACHE_DIR": str(tmp_path / "empty-cache")})
    assert done.returncode == 2
    assert done.stderr.startswith("txcoord conformance: --object-store runs txcoord's S3 server (versitygw), which is "
                                  f"not built at {tmp_path / 'empty-cache' / 's3'}")
    assert "run `python -m coordinator.conformance.versitygw build` once (it needs Go" in done.stderr
    assert not (tmp_path / "kit" / "checker.log").exists() and not (tmp_path / "kit" / "s3").exists()


@pytest.mark.parametrize("command, reason", [
    ("echo hello; cat > /dev/null", "the client printed a line that is not a JSON object: 'hello'"),
    ("exit 3", "the client exited with code 3 before the reply to 'start'"),
    ("cat > /dev/null", "timed out waiting for the reply to 'start'"),
    ("read -r op; echo '" + json.dumps({"reply": "start", "ok": False, "error": "AccessDeniedError", "message": "no"}) + "'; "
     "cat > /dev/null", "start failed: AccessDeniedError: no"),
])
def test_a_client_that_breaks_the_line_protocol_fails_the_case_with_the_reason(tmp_path, command, reason):
    with ClientProcess(command, tmp_path / "client", Deadline(2.0)) as client:
        with pytest.raises(CaseFailedError) as failed:
            client.start(tmp_path / "coordinator.toml", "g")
    assert str(failed.value).startswith(reason)
    assert client.process.returncode is not None  # none outlives its case


class _Checker:
    log_path = "checker.log"

    def __init__(self, alive: bool = True):
        self._alive = alive

    def alive(self) -> bool:
        return self._alive


def test_the_cases_run_concurrently_at_most_parallel_at_once_their_lines_in_the_kits_order(tmp_path):
    import threading

    lock, running, most, began = threading.Lock(), [0], [0], []

    def case(name: str, seconds: float, fails: bool = False):
        def run_it(run, deadline, new_client):
            with lock:
                began.append(name)
                running[0] += 1
                most[0] = max(most[0], running[0])
            threading.Event().wait(seconds)
            with lock:
                running[0] -= 1
            if fails:
                raise CaseFailedError(f"{name} saw nothing")
        return run_it

    cases = {"a": case("a", 0.1), "b": case("b", 0.3, fails=True), "slow": case("slow", 0.6), "c": case("c", 0.1),
             "d": case("d", 0.1)}
    run = Run("true", tmp_path, Lakehouse(str(tmp_path / "lakehouse")), tmp_path / "coordinator.toml", 10.0)
    lines: list[str] = []
    started = time.monotonic()
    failed = run_cases(run, _Checker(), cases, ["slow", "a", "b", "c", "d"], 2, lines.append)
    took = time.monotonic() - started

    assert lines == ["PASS a", "FAIL b: b saw nothing", "PASS slow", "PASS c", "PASS d"] and failed == ["b"]
    assert most[0] == 2 and began[0] == "slow"
    assert took < 0.6 + 0.3 + 0.1 + 0.1 + 0.1  # not one after another
    assert run_cases(run, _Checker(alive=False), {"a": case("a", 0)}, ["a"], 2, lines.append) == ["a"]
    assert lines[-1] == "FAIL a: the checker exited; see checker.log"


def test_the_slowest_cases_start_first_then_the_others_in_the_kits_order():
    every = [*CASES, *OBJECT_STORE_CASES]
    order = start_order(every)
    assert sorted(order) == sorted(every) and set(SLOWEST) <= set(every) and order[:len(SLOWEST)] == list(SLOWEST)
    assert order[len(SLOWEST):] == [name for name in every if name not in SLOWEST]
    assert start_order(["commit", "late_end", "rollback"]) == ["late_end", "commit", "rollback"]


def test_an_interrupted_run_ends_its_running_cases_at_once(tmp_path):
    began = []

    def waits(run, deadline, new_client):
        began.append("waits")
        deadline.wait_for(lambda: False, "what never comes")

    def interrupt(line: str) -> None:
        raise KeyboardInterrupt

    cases = {"quick": lambda run, deadline, new_client: None, "waits": waits, "later": waits}
    run = Run("true", tmp_path, Lakehouse(str(tmp_path / "lakehouse")), tmp_path / "coordinator.toml", 60.0)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_cases(run, _Checker(), cases, ["waits", "quick", "later"], 2, interrupt)
    assert time.monotonic() - started < 10 and began[0] == "waits"  # the pool waited for them: ended, not timed out
