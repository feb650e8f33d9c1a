"""The kit's case ``protocol_version`` (docs/protocol.md#versioning): every commit a client makes to its commit log
names the client protocol it was written under, ``"txcoordProtocol": 1`` in its ``commitInfo`` action; a commit that
names one the checker does not know is refused whole, with its reason in ``system/rejected``, and costs nothing
but itself. The kit writes that commit (a well-formed HALF, under protocol 2) into the client's own log, beside it.
"""

from __future__ import annotations

from coordinator.conformance.client import Deadline, message
from coordinator.conformance.primitives import (COMMIT, TOPIC, NewClient, Run, expect, expect_delivered, expect_outcome,
                                                group_of, read_through, started)
from coordinator.conformance.raw_log import RawCommitLog
from coordinator.lakehouse import delta_log_file
from coordinator.lakehouse.deltalog import commit_actions

__all__ = ["case_protocol_version"]

CASE = "protocol_version"
#: What the client's commits must name, and a protocol no checker of this protocol knows.
CURRENT, FUTURE = 1, 2
FIELD = "txcoordProtocol"
UNSUPPORTED = f"unsupported client protocol {FUTURE}"


def case_protocol_version(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    client = started(run, new_client, CASE)
    before = [message(TOPIC, b"conformance: under protocol 1", keys="versioning")]
    sent = client.send(before, COMMIT)
    expect_outcome(run, deadline, sent["transaction_id"], "COMMIT", by_check=False)
    expect_delivered(run, deadline, sent, before)
    log = RawCommitLog(run.lakehouse, group_of(CASE))
    unnamed = _not_naming_the_protocol(run, log.key, read_through(run, deadline, log.key))
    expect(not unnamed, f"the client's commit(s) of {log.key} name(s) no client protocol {CURRENT}: "
                        f"{unnamed} (each commit's commitInfo says \"{FIELD}\": {CURRENT}, a JSON number)")
    future = log.half(TOPIC, keys="versioning")
    version = log.records(future, commit_info={FIELD: FUTURE, "engineInfo": "txcoord-conformance"})
    after = [message(TOPIC, b"conformance: after a commit under protocol 2", keys="versioning")]
    expect_delivered(run, deadline, client.send(after, COMMIT), after)
    refused = deadline.wait_for(lambda: [row for row in run.observed.rejected_from(group_of(CASE))
                                         if (row["commit_log"], row["commit_version"]) == (log.key, version)],
                                f"system/rejected to refuse version {version} of {log.key}, under protocol {FUTURE}")
    expect([row["reason"] for row in refused] == [f"{UNSUPPORTED}: this checker reads protocol {CURRENT}"],
           f"system/rejected refused version {version} of {log.key} as {[row['reason'] for row in refused]}; "
           f"expected {UNSUPPORTED!r}")
    accepted = [row for row in run.observed.halves(group_of(CASE)) if row["transaction_id"] == future["transaction_id"]]
    expect(not accepted, f"system/half holds {future['transaction_id']}, written under protocol {FUTURE}")
    client.stop()


def _not_naming_the_protocol(run: Run, key: str, versions: int) -> list[str]:
    """The commits of log ``key`` up to ``versions`` that add records and do not name protocol :data:`CURRENT`, each
    as its version and what its ``commitInfo`` names."""
    unnamed = []
    for version in range(versions):
        commit = run.lakehouse.files.read(f"{key}/{delta_log_file(version)}")
        actions = commit_actions(commit.data) if commit is not None else []
        if not any(action.get("add", {}).get("dataChange") for action in actions):
            continue  # the log's creation, a compaction: no records to read under a protocol
        info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
        named = info.get(FIELD) if isinstance(info, dict) else None
        if type(named) is not int or named != CURRENT:
            unnamed.append(f"version {version}: {FIELD} {named!r}")
    return unnamed
