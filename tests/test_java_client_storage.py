"""The Java client (clients/java) against the real S3 server through the storage-fault proxy
(coordinator/conformance/faults.py), issue 60 point 6: its instance stays live while the storage stalls its reads,
and its S3 store answers a lost reply, a 503 and a 403 as coordinator/storage.py does.

- A conditional write whose reply was lost is retried; refused on the retry, the file is read back, and holding
  this writer's bytes it is taken as made (neither success nor failure blindly): a create, and a replace.
- 503 (SlowDown) is retried with backoff; out of retries, a read is ``StorageUnavailableError`` (retriable) and a
  conditional write ``WriteOutcomeUnknownError`` (its outcome unknown).
- 403 is ``AccessDeniedError`` at once, not retriable, naming the file.

The store is driven by ``S3StoreProbe`` (clients/java/src/test/java: one operation a JSON line), the producer by
the conformance driver. The Maven build is made once per session (support.java_client)."""

import json
import queue
import subprocess
import threading
import time

import pytest

from support.checker import write_config
from coordinator.conformance.faults import FaultProxy
from support.java_client import JAVA_CLIENT, JVM_OPTIONS
from support.waiting import wait_until

pytestmark = pytest.mark.slow

PROBE = JAVA_CLIENT / "src" / "test" / "java" / "io" / "txcoord" / "client" / "internal" / "S3StoreProbe.java"
#: How long the proxy holds each read while the producer's reads stall: past the liveness window (three
#: heartbeats of 1 s) many times, within the client's socket timeout (30 s), so that one read stays in flight.
STALL_S = 20.0
REPLY_TIMEOUT_S = 120.0


class JsonLines:
    """A JVM that takes one JSON line and answers one (the probe, the conformance driver); its stderr in a file."""

    def __init__(self, argv: list[str], stderr_path):
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "w")
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                        text=True)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith("{"):
                self._lines.put(json.loads(line))

    def __call__(self, op: str, **fields) -> dict:
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        try:
            return self._lines.get(timeout=REPLY_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"no reply to {op} in {REPLY_TIMEOUT_S} s:\n{self.stderr()[-3000:]}") from None

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def close(self) -> int:
        if self.process.poll() is None:
            self.process.stdin.close()
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self._stderr.close()


def probe(java_client, root: str, storage: dict, tmp_path, **settings) -> JsonLines:
    config = write_config(root, str(tmp_path), storage={**storage, **settings})
    return JsonLines(["java", *JVM_OPTIONS, "-cp", java_client, str(PROBE), "--config", config],
                     tmp_path / "probe.stderr")


def test_a_conditional_write_whose_reply_was_lost_is_found_to_be_this_writers(java_client, s3_lakehouse, s3_server,
                                                                              tmp_path):
    with FaultProxy(s3_server.endpoint) as proxy:
        store = probe(java_client, s3_lakehouse.root, proxy.storage_options(s3_server.storage_options), tmp_path)
        try:
            # The create reaches the server, its reply does not: the retry is refused (412), the file read back.
            proxy.inject_next("drop_reply", method="PUT", path_contains="probe/claim")
            assert store("create", key="probe/claim", data="mine-1") == {"ok": True, "result": True}
            assert proxy.counts()["injected"]["drop_reply"] == 1 and proxy.counts()["by_status"].get("412") == 1
            # Another writer's create of the same file is refused at its first attempt: no read back, taken.
            assert store("create", key="probe/claim", data="theirs") == {"ok": True, "result": False}
            first = store("read", key="probe/claim")["result"]
            assert first["data"] == "mine-1"

            proxy.inject_next("drop_reply", method="PUT", path_contains="probe/claim")
            assert store("replace", key="probe/claim", data="mine-2", etag=first["etag"]) == {"ok": True, "result": True}
            assert store("read", key="probe/claim")["result"]["data"] == "mine-2"
            # A replace from a version another writer has since changed is refused.
            assert store("replace", key="probe/claim", data="mine-3", etag=first["etag"]) == {"ok": True,
                                                                                             "result": False}
            assert store("read", key="probe/claim")["result"]["data"] == "mine-2"
            assert proxy.counts()["injected"]["drop_reply"] == 2
        finally:
            assert store.close() == 0
    log = store.stderr()
    for operation in ("create", "replace"):
        assert f"probe/claim: {operation} found already made by this writer (an earlier attempt's reply was lost)" in log


def test_a_503_is_retried_with_backoff_and_out_of_retries_says_whether_a_write_may_have_been_made(
        java_client, s3_lakehouse, s3_server, tmp_path):
    with FaultProxy(s3_server.endpoint, rates={"slowdown": 1.0}) as proxy:
        proxy.disable()
        store = probe(java_client, s3_lakehouse.root, proxy.storage_options(s3_server.storage_options), tmp_path,
                      max_retries="2", retry_timeout="30s")
        try:
            proxy.inject_next("slowdown", method="PUT", path_contains="probe/record")
            assert store("put", key="probe/record", data="v1")["ok"]
            proxy.inject_next("slowdown", method="GET", path_contains="probe/record")
            assert store("read", key="probe/record")["result"]["data"] == "v1"
            counts = proxy.counts()
            assert counts["injected"]["slowdown"] == 2 and counts["by_method"] == {"PUT": 2, "GET": 2}

            proxy.enable()  # every request throttled: 1 attempt and max_retries (2) retries, then the error
            read = store("read", key="probe/record")
            assert (read["ok"], read["error"], read["retriable"], read["outcome_unknown"]) == (
                False, "StorageUnavailableError", True, False)
            created = store("create", key="probe/other", data="x")
            assert (created["ok"], created["error"], created["retriable"], created["outcome_unknown"]) == (
                False, "WriteOutcomeUnknownError", True, True)
            assert proxy.counts()["by_method"] == {"PUT": 5, "GET": 5}
            assert "failed 3 time(s)" in created["message"] and "max_retries and retry_timeout" in created["message"]
        finally:
            assert store.close() == 0
    log = store.stderr()
    assert "probe/record: put retried (attempt 2) after throttled" in log
    assert "probe/record: read retried (attempt 2) after throttled" in log


def test_a_403_is_access_denied_at_once_naming_the_file(java_client, s3_lakehouse, s3_server, tmp_path):
    with FaultProxy(s3_server.endpoint) as proxy:
        storage = dict(proxy.storage_options(s3_server.storage_options), aws_secret_access_key="not-the-secret")
        store = probe(java_client, s3_lakehouse.root, storage, tmp_path)
        try:
            for op, fields in (("put", {}), ("create", {}), ("read", {})):
                reply = store(op, key="probe/denied", data="x", **fields)
                assert (reply["ok"], reply["error"], reply["retriable"], reply["outcome_unknown"]) == (
                    False, "AccessDeniedError", False, False), reply
                assert reply["message"].startswith(f"{s3_lakehouse.root}/probe/denied: access denied by the storage")
                assert "answered 403" in reply["message"]
            assert proxy.counts()["requests"] == 3  # none retried
        finally:
            assert store.close() == 0


def test_the_java_producer_stays_live_while_the_storage_stalls_its_reads(java_client, s3_lakehouse, s3_server,
                                                                         tmp_path):
    """The follower's reads of check_requests each held STALL_S by the proxy; the heartbeat's writes go through.
    The instance must stay live by the checker's own rule (coordinator.control.instances) all along."""
    from coordinator.control.instances import ProducerInstances

    instances = ProducerInstances(s3_lakehouse)  # straight to the server: the test's reads are not held
    with FaultProxy(s3_server.endpoint, rates={"delay": 1.0}, methods=["GET", "HEAD"], delay_s=STALL_S) as proxy:
        proxy.disable()
        config = write_config(s3_lakehouse, str(tmp_path), storage=proxy.storage_options(s3_server.storage_options),
                              producer_heartbeat_ms=1000)
        driver = JsonLines(["java", *JVM_OPTIONS, "-cp", java_client, "io.txcoord.client.conformance.ConformanceDriver"],
                           tmp_path / "driver.stderr")
        try:
            started = driver("start", config=config, group="stall_group")
            assert started["ok"], driver.stderr()[-3000:]
            instance = started["instance_id"]
            proxy.enable()
            wait_until(lambda: proxy.counts()["injected"]["delay"] >= 1, timeout_s=60,
                       what="a read of the producer's held by the proxy")
            stalled_at = time.monotonic()
            renewals = set()
            # Half the stall: the read held at its start is still held at the end of this loop.
            while time.monotonic() - stalled_at < STALL_S / 2:
                live = {each.instance_id: each for each in instances.live("stall_group")}
                assert instance in live, f"the instance looked dead {time.monotonic() - stalled_at:.1f} s into the stall"
                renewals.add(live[instance].last_seen)
                time.sleep(0.5)
            assert len(renewals) >= 3, renewals
            proxy.disable()
            assert driver("stop")["ok"]
        finally:
            assert driver.close() == 0, driver.stderr()[-3000:]
    assert instances.live("stall_group") == []  # withdrawn at shutdown, not renewed after
