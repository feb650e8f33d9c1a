"""What every case of the kit is given and judges with: the :class:`Run` (where things are, how a case starts a
client), the kit's settings and TOML, the protocol's words as the line protocol spells them, and the checks a
case makes of what the checker really did (:mod:`.observed`). A case raises
:class:`~coordinator.exceptions.CaseFailedError` with the reason when the client or the checker's tables disagree
with the protocol.

The bottom of the kit but for the client processes (:mod:`.client`), the checker's tables as read
(:mod:`.observed`) and the raw writer (:mod:`.raw_log`): the case modules import it, the case list
(:mod:`.cases`) imports them, the runner (:mod:`.kit`) imports the case list; never the other way
(tests/test_layering.py).

Example::

    def case_commit(run: Run, deadline: Deadline, new_client: NewClient) -> None:
        client = started(run, new_client, "commit")
        sent = client.send([message(TOPIC, b"x")], COMMIT)
        expect_outcome(run, deadline, sent["transaction_id"], "COMMIT", by_check=False)
"""

from __future__ import annotations

import base64
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from coordinator.commit_logs import versions_written
from coordinator.conformance.client import ClientProcess, Deadline
from coordinator.conformance.observed import Observed
from coordinator.control.progress import CheckerProgress
from coordinator.exceptions import CaseFailedError
from coordinator.lakehouse import Lakehouse

__all__ = ["COMMIT", "Case", "HANG", "KIT_SETTINGS", "NewClient", "OTHER_TOPIC", "ROLLBACK", "Run", "TOPIC", "UNKNOW",
           "expect", "expect_delivered", "expect_nothing_delivered", "expect_outcome", "group_of", "read_through",
           "started", "write_config"]

COMMIT, ROLLBACK, UNKNOW, HANG = "COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW", "HANG"
TOPIC, OTHER_TOPIC = "CONFORMANCE", "CONFORMANCE_AUDIT"

#: The checker's and the clients' timings: short, so that a check comes within seconds.
KIT_SETTINGS = {
    "transaction_timeout_ms": 1500,
    "transaction_check_interval_ms": 1000,
    "transaction_check_max": 60,
    "producer_heartbeat_ms": 1000,
    "trigger_interval_ms": 100,
    "metrics_record_interval_ms": 0,
    "maintenance_interval_ms": 0,
}

NewClient = Callable[[], ClientProcess]
Case = Callable[["Run", Deadline, NewClient], None]


@dataclass
class Run:
    """One run of the kit: where things are, and how a case starts a client."""

    command: str
    workdir: Path
    lakehouse: Lakehouse
    config: Path
    case_timeout_s: float
    #: The lakehouse's object store with ``--object-store`` (:class:`~coordinator.conformance.object_store.ObjectStore`:
    #: its server and accounts), else ``None``. Not imported here: the cases below it read its attributes.
    object_store: Optional[Any] = None
    observed: Observed = field(init=False)

    def __post_init__(self) -> None:
        self.observed = Observed(self.lakehouse)

    @contextlib.contextmanager
    def clients(self, case: str, deadline: Deadline) -> Iterator[NewClient]:
        """A factory of the case's client processes (each in ``<workdir>/<case>/client-<n>``); none outlives it."""
        started: list[ClientProcess] = []

        def new_client() -> ClientProcess:
            started.append(ClientProcess(self.command, self.workdir / case / f"client-{len(started) + 1}", deadline))
            return started[-1]

        try:
            yield new_client
        finally:
            for client in started:
                client.close()


def write_config(path: Path, lakehouse: Lakehouse, storage: Optional[Mapping[str, str]] = None,
                 settings: Mapping[str, object] = KIT_SETTINGS) -> Path:
    """A coordinator TOML for ``lakehouse`` with ``settings``, ``storage`` as its ``[storage]`` table (default: the
    lakehouse's own). A JSON string is a valid TOML basic string: quotes and backslashes stay safe."""
    lines = ["# Written by `txcoord conformance`; read by its checker and by the client under test.",
             f"lakehouse = {json.dumps(lakehouse.root)}", *(f"{key} = {value}" for key, value in settings.items())]
    storage = lakehouse.storage if storage is None else storage
    if storage:
        lines += ["", "[storage]", *(f"{key} = {json.dumps(value)}" for key, value in storage.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def group_of(case: str) -> str:
    """The producer group of ``case``: its instances and checks are its alone."""
    return f"conformance_{case}"


def expect(condition: object, reason: str) -> None:
    if not condition:
        raise CaseFailedError(reason)


def started(run: Run, new_client: NewClient, case: str, config: Optional[Path] = None) -> ClientProcess:
    """A new client process of ``case``'s group, started on ``config`` (default: the run's TOML)."""
    client = new_client()
    client.start(config or run.config, group_of(case))
    return client


def expect_outcome(run: Run, deadline: Deadline, transaction_id: str, outcome: str, by_check: bool) -> dict:
    """Wait for the decision; fail unless it is ``outcome``, by a check's answer or by the producer's own END."""
    row = deadline.wait_for(lambda: run.observed.outcome(transaction_id), f"system/op to decide {transaction_id}")
    how = "a check's answer" if by_check else "the producer's own END"
    expect(row["outcome"] == outcome and (row["check_id"] is not None) == by_check,
           f"system/op decided {transaction_id} {row['outcome']} with check id {row['check_id']!r}; "
           f"expected {outcome} by {how}")
    return row


def expect_delivered(run: Run, deadline: Deadline, sent: dict, messages: list[dict]) -> None:
    """Every message of the send in its topic table, once, with its id, body, keys, tags and properties."""
    transaction_id = sent["transaction_id"]
    for msg_id, sent_message in zip(sent["msg_ids"], messages):
        topic = sent_message["topic"]
        rows = deadline.wait_for(lambda: [row for row in run.observed.delivered(topic, transaction_id)
                                          if row["msg_id"] == msg_id], f"message {msg_id} in topics/{topic}")
        expect(len(rows) == 1, f"message {msg_id} delivered {len(rows)} times to topics/{topic}")
        row = rows[0]
        wanted = {"body": base64.b64decode(sent_message["body"]), "keys": sent_message["keys"],
                  "tags": sent_message["tags"], "properties": sent_message["properties"]}
        got = {"body": row["body"], "keys": row["keys"], "tags": row["tags"], "properties": dict(row["properties"] or [])}
        expect(got == wanted, f"topics/{topic} holds {got} for message {msg_id}; sent {wanted}")


def expect_nothing_delivered(run: Run, transaction_id: str, topics: Iterable[str] = (TOPIC,)) -> None:
    for topic in topics:
        rows = run.observed.delivered(topic, transaction_id)
        expect(not rows, f"{len(rows)} message(s) of {transaction_id} delivered to topics/{topic}")


def read_through(run: Run, deadline: Deadline, key: str) -> int:
    """Wait until the checker has read the commit log ``key`` through every version it has now; that count."""
    written = versions_written(run.lakehouse.files, key)

    def read_all_of_it() -> bool:
        progress = CheckerProgress(run.lakehouse).load()
        return progress is not None and progress.next_versions.get(key, 0) >= written

    deadline.wait_for(read_all_of_it, f"the checker to read {key} through version {written - 1}")
    return written
