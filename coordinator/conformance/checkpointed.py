"""The kit's case ``checkpointed_log`` (docs/protocol.md, "The steps of one commit", step 4): other writers move
the client's commit log on while the client is idle, then a Delta checkpoint is written past them and the commits
before it are deleted, as maintenance does once the checker has read them. The client's next send must land
after the checkpoint: a client that takes the next version from what it knew (not from ``_last_checkpoint``)
creates, again, a version every reader skips, and its message is never delivered while the send says it was
stored. Nothing else in the kit can see that rule broken.
"""

from __future__ import annotations

import json
import time

from coordinator.conformance.client import Deadline, message
from coordinator.conformance.primitives import (COMMIT, TOPIC, NewClient, Run, expect, expect_delivered, expect_outcome,
                                                group_of, read_through, started)
from coordinator.conformance.raw_log import RawCommitLog
from coordinator.lakehouse import delta_log_file
from coordinator.lakehouse.checkpoints import write_delta_checkpoint

__all__ = ["case_checkpointed_log"]

CASE = "checkpointed_log"
#: Empty commits the kit appends (as another instance sharing the log, or an operator's compaction, would).
OTHERS_COMMITS = 3


def case_checkpointed_log(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    client = started(run, new_client, CASE)
    first = [message(TOPIC, b"conformance: before the checkpoint", keys="checkpointed")]
    before = client.send(first, COMMIT)
    expect_delivered(run, deadline, before, first)
    log = RawCommitLog(run.lakehouse, group_of(CASE))
    latest = [log.commit(_empty_commit()) for _ in range(OTHERS_COMMITS)][-1]
    read_through(run, deadline, log.key)
    write_delta_checkpoint(run.lakehouse.key_path(log.key), latest, run.lakehouse.storage)
    for version in range(latest):  # what maintenance deletes once the checker has read it
        run.lakehouse.files.delete(f"{log.key}/{delta_log_file(version)}")
    second = [message(TOPIC, b"conformance: after the checkpoint", keys="checkpointed")]
    after = client.send(second, COMMIT)
    expect_outcome(run, deadline, after["transaction_id"], "COMMIT", by_check=False)
    expect_delivered(run, deadline, after, second)
    stale = [version for version in range(latest) if run.lakehouse.files.exists(f"{log.key}/{delta_log_file(version)}")]
    expect(not stale, f"the client created version(s) {stale} of {log.key} again, below its checkpoint at {latest}: "
                      "every reader skips them (read _delta_log/_last_checkpoint before each commit)")
    client.stop()


def _empty_commit() -> bytes:
    return json.dumps({"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE",
                                      "operationParameters": {"mode": "Append"}, "isBlindAppend": True,
                                      "engineInfo": "txcoord-conformance"}}).encode()

