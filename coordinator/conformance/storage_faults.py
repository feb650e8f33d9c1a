"""The kit's cases of hostile storage (``--object-store`` only; docs/protocol.md, "The steps of one commit", step 8,
and "Sending a transaction", step 4): the client under test reaches the bucket through the storage-fault proxy
(:mod:`.faults`), which gives the commit of its send's half a lost reply, 503s or a reply slower than the
client's own timeout, exactly where each case asks. Each send is judged by its outcome, as the checker saw it:

- a ``SEND_OK`` is a message delivered, once, decided by the producer's own END;
- an error is a local transaction never run (no END of the client's own for a half it was not told is durable);
- an error that says the half was not stored (``outcome_unknown`` false) is a half the checker never accepted:
  where the storage made the write, only an outcome-unknown error is true;
- a half the storage made behind an error is checked back, and rolled back by the answer the kit gives (its local
  transaction never ran);
- no half of the group is refused (one committed again after a lost reply is refused as a duplicate).

The clients of these cases read the run's ``faulty.toml``: the proxy as their endpoint, a retry bound of
:data:`ATTEMPTS` attempts and a request timeout of :data:`REQUEST_TIMEOUT_S` (``[storage]`` ``max_retries``,
``retry_timeout`` and ``timeout``).
"""

from __future__ import annotations

from coordinator.commit_logs import versions_written
from coordinator.conformance.client import ClientProcess, Deadline, message
from coordinator.conformance.primitives import (COMMIT, ROLLBACK, TOPIC, NewClient, Run, expect, expect_delivered,
                                                expect_nothing_delivered, expect_outcome, group_of, read_through,
                                                started)
from coordinator.doorbells import Doorbell
from coordinator.exceptions import CaseFailedError

__all__ = ["ATTEMPTS", "FAULT_STORAGE", "REQUEST_TIMEOUT_S", "SLOW_REPLY_S", "case_lost_reply", "case_slow_reply",
           "case_throttled", "case_unknown_outcome"]

#: Retries of one request the clients are told to make (``[storage] max_retries``): a fault on every attempt of
#: the bound, ``ATTEMPTS``, leaves a client that keeps the bound no answer.
MAX_RETRIES = 3
ATTEMPTS = MAX_RETRIES + 1
#: One request's bound (``[storage] timeout``), and how long the proxy holds a request it delays: long past it.
REQUEST_TIMEOUT_S = 3
SLOW_REPLY_S = 8.0
#: The ``[storage]`` settings of the clients of these cases, beside the proxy's endpoint.
FAULT_STORAGE = {"max_retries": str(MAX_RETRIES), "retry_timeout": "60s", "timeout": f"{REQUEST_TIMEOUT_S}s"}


def case_lost_reply(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    """The half's commit is made and its reply lost, once: within the bound, the client must find out it was its own."""
    case = "lost_reply"
    client = started(run, new_client, case, run.object_store.faulty_config)
    reply = _send_through(run, client, case, ["drop_reply"], b"conformance: its commit's reply lost once")
    expect(_sent(reply), f"the half's commit was made and its reply lost once, within the retry bound: the client "
                         f"replied {_summary(reply)}; expected SEND_OK (retry the same create; refused as taken, read "
                         "it back: the same bytes are this client's)")
    _judge(run, deadline, client, case, reply, set())
    _stop_and_judge_log(run, deadline, client, case, _confirmed(reply))


def case_throttled(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    """503 SlowDown on the half's commit: twice, then on every attempt of the retry bound."""
    case = "throttled"
    client = started(run, new_client, case, run.object_store.faulty_config)
    within = _send_through(run, client, case, ["slowdown"] * 2, b"conformance: throttled twice")
    expect(_sent(within), f"the half's commit was answered 503 SlowDown twice, within the retry bound: the client "
                          f"replied {_summary(within)}; expected SEND_OK (retry the same create)")
    seen = _judge(run, deadline, client, case, within, set())
    past = _send_through(run, client, case, ["slowdown"] * ATTEMPTS, b"conformance: throttled past the bound")
    _judge(run, deadline, client, case, past, seen)
    _stop_and_judge_log(run, deadline, client, case, _confirmed(within, past))


def case_unknown_outcome(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    """The half's commit never answered within the bound: its first attempt's connection reset before it reached
    the server, every later one made with its reply lost. The half is stored; the client cannot know it."""
    case = "unknown_outcome"
    client = started(run, new_client, case, run.object_store.faulty_config)
    reply = _send_through(run, client, case, ["reset"] + ["drop_reply"] * (ATTEMPTS - 1),
                          b"conformance: no answer within the bound")
    _judge(run, deadline, client, case, reply, set())
    _stop_and_judge_log(run, deadline, client, case, _confirmed(reply))


def case_slow_reply(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    """Every attempt of the half's commit held far past the client's request timeout, then made: each attempt
    times out at the client, and the half lands after it gave up (or while it retries)."""
    case = "slow_reply"
    client = started(run, new_client, case, run.object_store.faulty_config)
    reply = _send_through(run, client, case, ["delay"] * ATTEMPTS, b"conformance: replies slower than the timeout")
    _judge(run, deadline, client, case, reply, set())
    _stop_and_judge_log(run, deadline, client, case, _confirmed(reply))


#: The faults after which the storage has made the write (the proxy forwarded the request).
_MADE = ("drop_reply", "delay")


def _log_key(run: Run, case: str) -> str:
    """The first commit log of ``case``'s group: its client's, the group's first instance."""
    return f"{run.lakehouse.group_dir(group_of(case))}/commit_log"


def _send_through(run: Run, client: ClientProcess, case: str, faults: list[str], body: bytes) -> dict:
    """A COMMIT send whose half's commit meets ``faults``, one per attempt in order (queued for the PUTs of the
    case's own log's commits, no other request); its reply, with the messages sent (``"sent"``), whether the
    storage made the half's write on an attempt the faults met (``"made"``) and the log's versions before
    (``"versions"``)."""
    proxy, path = run.object_store.proxy, f"{_log_key(run, case)}/_delta_log/0"
    versions = versions_written(run.lakehouse.files, _log_key(run, case))
    for kind in faults:
        proxy.inject_next(kind, method="PUT", path_contains=path)
    messages = [message(TOPIC, body, keys=case)]
    reply = client.request(client.send_op(messages, COMMIT))
    served = len(faults) - proxy.counts()["queued_by_path"].get(path, 0)
    expect(served > 0, f"no commit of the client reached {path} through the proxy: does it write through the "
                       "[storage] settings' aws_endpoint?")
    return reply | {"sent": messages, "made": any(kind in _MADE for kind in faults[:served]), "versions": versions}


def _judge(run: Run, deadline: Deadline, client: ClientProcess, case: str, reply: dict, seen: set[str]) -> set[str]:
    """``reply``, to a send made under faults, judged by its outcome (see the module). ``seen``: the group's
    transactions judged before; returned with those of this send."""
    if _sent(reply):
        transaction_id = reply["transaction_id"]
        try:
            expect_outcome(run, deadline, transaction_id, "COMMIT", by_check=False)
            expect_delivered(run, deadline, reply, reply["sent"])
        except CaseFailedError as failure:
            raise CaseFailedError(f"the client replied SEND_OK for {transaction_id}, yet {failure}") from None
        return seen | {transaction_id}
    expect(reply.get("ok") is False and reply.get("error"),
           f"the client replied {_summary(reply)} to a send; expected SEND_OK or an error")
    group = group_of(case)
    if reply["made"]:
        # The proxy may hold the write a while yet. Once it lands, the kit rings the group's doorbell for it: the
        # client never saw it land, so cannot, and a quiet group's commits are otherwise found within a minute.
        key = _log_key(run, case)
        deadline.wait_for(lambda: versions_written(run.lakehouse.files, key, known=reply["versions"]) > reply["versions"],
                          f"the half's commit, which the storage made, in {key}")
        Doorbell(run.lakehouse.files, group).landed()
        stored = deadline.wait_for(lambda: _halves(run, group) - seen, "system/half to hold the half the storage made")
    else:
        read_through(run, deadline, _log_key(run, case))
        stored = _halves(run, group) - seen
    expect(reply.get("outcome_unknown") is True or not stored,
           f"the client replied {_summary(reply)}, which says the half was not stored, yet the checker accepted "
           f"{sorted(stored)}: where the storage never answered, only an error whose outcome_unknown is true is right")
    for transaction_id in sorted(stored):  # its local transaction never ran: the check's answer rolls it back
        client.answer(transaction_id, ROLLBACK)
        expect_outcome(run, deadline, transaction_id, "ROLLBACK", by_check=True)
        expect_nothing_delivered(run, transaction_id)
    return seen | stored


def _stop_and_judge_log(run: Run, deadline: Deadline, client: ClientProcess, case: str, confirmed: set[str]) -> None:
    """Stop the client (everything it submitted is then written), then judge its log: no END of its own for a
    transaction it did not confirm (``confirmed``: those it replied SEND_OK for), no half of the group refused."""
    client.stop()
    group = group_of(case)
    read_through(run, deadline, _log_key(run, case))
    ran = sorted({row["transaction_id"] for row in run.observed.log_records(group)
                  if row["kind"] == "END" and row["check_id"] is None} - confirmed)
    expect(not ran, f"the client's commit log holds its own END of {ran}, a send it did not reply SEND_OK to: it ran "
                    "the local transaction of a half it was not told is durable")
    # An END may be refused in the normal course (an answer to a check of a transaction decided meanwhile); a half never.
    refused = [row for row in run.observed.rejected_from(group) if row["kind"] != "END"]
    expect(not refused, f"system/rejected holds {[(row['transaction_id'], row['reason']) for row in refused]} from the "
                        "group: a half committed again after a lost reply is a duplicate (read back the version whose "
                        "create was refused: the same bytes are this client's)")


def _halves(run: Run, group: str) -> set[str]:
    return {row["transaction_id"] for row in run.observed.halves(group)}


def _confirmed(*replies: dict) -> set[str]:
    """The transactions of ``replies`` the client replied SEND_OK for."""
    return {reply["transaction_id"] for reply in replies if _sent(reply)}


def _sent(reply: dict) -> bool:
    return reply.get("ok") is True and reply.get("send_status") == "SEND_OK"


def _summary(reply: dict) -> dict:
    return {key: reply[key] for key in ("ok", "send_status", "error", "retriable", "outcome_unknown") if key in reply}
