"""Bytes a hostile group may write in its own prefix (docs/design.md#hostile-input), each with the reason the
checker must refuse it for: what the tests, the benchmarks and the chaos harness's poisoning tenant write
(:class:`PoisoningTenant`, round after round).

A :class:`PoisonedLog` (the conformance kit's :class:`~coordinator.conformance.raw_log.RawCommitLog`) writes raw
versions into a group's commit log through :class:`FileStore` (a local disk or S3, created only if absent, as any
writer of the log must), and raw files into its ``_producers/``.

Example::

    log = PoisonedLog(lakehouse, "mallory")
    version = POISONS["a commit that is not JSON"].write(log)      # the version it took
    POISONS["a commit that is not JSON"].reason                    # 'line 1 is not JSON'
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from coordinator.checker.segment import MAX_DATA_FILE_ROWS
from coordinator.conformance.raw_log import RawCommitLog
from coordinator.lakehouse import Lakehouse
from coordinator.lakehouse.deltalog import MAX_COMMIT_FILE_BYTES
from coordinator.names import NAME_PATTERN
from coordinator.protocol import PROTOCOL_FIELD
from coordinator.tables import COMMIT_LOG

__all__ = ["INSTANCE_POISONS", "POISONS", "Poison", "PoisonedLog", "PoisoningTenant"]

PoisonedLog = RawCommitLog


@dataclass(frozen=True)
class Poison:
    """What to write (into a :class:`PoisonedLog`, returning the version it took) and the refusal it must meet."""

    write: Callable[[PoisonedLog], int]
    reason: str


def _half(group: str, topic: str) -> dict:
    return {"record_id": uuid.uuid4().hex, "kind": "HALF", "transaction_id": uuid.uuid4().hex, "producer_group": group,
            "msg_id": uuid.uuid4().hex, "message_index": 0, "message_count": 1, "topic": topic, "body": b"poison"}


#: Each poison a group can write into its own commit log, by what it is.
POISONS = {
    "a commit that is not JSON": Poison(lambda log: log.commit(b"{not json"), "line 1 is not JSON"),
    "a commit line that is not an object": Poison(lambda log: log.commit(b'["add"]'), "line 1 is not a JSON object"),
    "JSON nested beyond parsing": Poison(lambda log: log.commit(b"[" * 200_000 + b"]" * 200_000), "is not JSON"),
    "an add without a path": Poison(lambda log: log.commit(b'{"add": {"size": 1}}'), "an add action without a string path"),
    "a commit too large to be a commit": Poison(lambda log: log.commit(b" " * (MAX_COMMIT_FILE_BYTES + 1)),
                                                f"at most {MAX_COMMIT_FILE_BYTES} are read"),
    "a data file that is not Parquet": Poison(lambda log: log.add(log.data_file(b"PAR1 not really")),
                                              "cannot be read as commit-log records"),
    "an add naming a missing file": Poison(lambda log: log.add("part-00000-gone.parquet"), "is missing"),
    "ill-typed columns": Poison(lambda log: log.add(log.parquet(pa.table(
        {name: pa.array([[1]]) for name in COMMIT_LOG.column_names}))), "cannot be read as commit-log records"),
    "only record_id": Poison(lambda log: log.add(log.parquet(pa.table({"record_id": ["r"]}))),
                             "lacks the commit log's column(s) kind"),
    "rows beyond any commit (a decompression bomb)": Poison(
        lambda log: log.add(log.parquet(pa.table({"record_id": pa.nulls(MAX_DATA_FILE_ROWS + 1, pa.string())}))),
        f"at most {MAX_DATA_FILE_ROWS} are read"),
    "a path double percent-encoded": Poison(lambda log: log.add("%252E%252E/%252E%252E/alice/commit_log/x.parquet"),
                                            "data file outside the commit log's directory"),
    "a path climbing out": Poison(lambda log: log.add("../../alice/commit_log/x.parquet"),
                                  "data file outside the commit log's directory"),
    "an absolute URI": Poison(lambda log: log.add("file:///etc/passwd"), "data file outside the commit log's directory"),
    "a commit under a client protocol the checker does not know": Poison(
        lambda log: log.records(_half(log.group, "ORDERS"), commit_info={PROTOCOL_FIELD: 2}),
        "unsupported client protocol 2: this checker reads protocol 1"),
    "a client protocol that is no number": Poison(
        lambda log: log.records(_half(log.group, "ORDERS"), commit_info={PROTOCOL_FIELD: "1"}),
        'unsupported client protocol "1"'),
    "a topic name that decodes to a path": Poison(
        lambda log: log.records(_half(log.group, "CAROL_%2F%2E%2E%2FPAYMENTS")), f"topic does not match {NAME_PATTERN}"),
}

#: Files a group can write into its own ``_producers/`` that are no instance's record, by what they are: the
#: bytes (given the group) and the refusal they must meet once the checker surveys the group.
INSTANCE_POISONS = {
    "an instance record with last_seen null": (
        lambda group: json.dumps({"group": group, "instance_id": "poison-1", "host": "h", "pid": 1, "last_seen": None,
                                  "heartbeat_s": 2.0}).encode(), "last_seen is NoneType"),
    "an instance record that is not JSON": (lambda group: b"{nope", "not JSON"),
    "an instance record too large to be one": (lambda group: b" " * 5000, "at most 4096"),
}


class PoisoningTenant(threading.Thread):
    """Writes every poison of :data:`POISONS` into ``group``'s prefix, again every ``every_s`` seconds, until
    stopped; what it wrote, by log and version.

    Example::

        tenant = PoisoningTenant(Lakehouse("lakehouse"), "mallory", every_s=3.0)
        tenant.start(); ...; tenant.stop()
        tenant.refused(Lakehouse("lakehouse")) == len(tenant.written)  # every poison refused with its reason
    """

    def __init__(self, lakehouse: Lakehouse, group: str, every_s: float) -> None:
        """``lakehouse`` as the tenant reaches it (behind a latency, through its own proxy, say)."""
        super().__init__(name="poisoning-tenant", daemon=True)
        self.log = PoisonedLog(lakehouse, group)
        self.every_s = every_s
        self.written: list[tuple[str, int, str]] = []  # (what, version, the reason expected)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while True:
            for what, poison in POISONS.items():
                self.written.append((what, poison.write(self.log), poison.reason))
            if self._stop_event.wait(self.every_s):
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def refused(self, lakehouse: Lakehouse) -> int:
        """How many of the poisons written ``system/rejected`` refused, each at its version with its reason."""
        rows = lakehouse.read("system/rejected", ["commit_log", "commit_version", "reason"]).to_pylist()
        reasons = {(row["commit_log"], row["commit_version"]): row["reason"] for row in rows}
        return sum(1 for _, version, expected in self.written
                   if expected in (reasons.get((self.log.key, version)) or ""))
