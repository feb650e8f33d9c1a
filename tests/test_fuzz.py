"""Hostile input at scale: generated messages and raw commit-log records.

Whatever arrives, each input is accepted or refused with a reason, the valid
traffic around it is delivered exactly once, and no name addresses a path outside
the lakehouse's ``topics/``.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.exceptions import MessageValidationError
from coordinator.lakehouse import Lakehouse
from coordinator.producer.message import Message
from coordinator.protocol import CHECK_IMMUNITY_TIME_IN_SECONDS
from coordinator.validation import MAX_BODY_BYTES, validate_topic

from support import end_record, half_record
from support.batches import ManualChecker

HOSTILE_TOPICS = ["T", "../T", "a/b", "/etc", ".", "..", "", " ", "T\n", "%|_-", "_-", "A%2F%2E%2E", "x" * 128, "ÄRGER", "T\x00", None]
HOSTILE_IMMUNITY = ["5", "0", "-1", " 5", "５", "abc", "99999999999", "", None]
topics = st.one_of(st.sampled_from(HOSTILE_TOPICS), st.text(max_size=12))
properties = st.one_of(
    st.none(),
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    st.builds(lambda v: {CHECK_IMMUNITY_TIME_IN_SECONDS: v} if v is not None else {}, st.sampled_from(HOSTILE_IMMUNITY)),
    st.just({"big": "x" * 200_000}),
)


def accepted_by_producer(message: Message) -> bool:
    try:
        message.validate()
    except MessageValidationError as error:
        assert str(error), "a refusal must say why"
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(topic=topics)
def test_no_accepted_topic_addresses_a_path_outside_topics(topic):
    try:
        validate_topic(topic)
    except (MessageValidationError, TypeError):
        return
    lakehouse = "/data/lakehouse"
    path = Lakehouse(lakehouse).topic(topic)
    assert os.path.dirname(os.path.normpath(path)) == f"{lakehouse}/topics" and os.path.basename(path) == topic


def follows_the_rules(topic, body: bytes, properties) -> bool:
    """The message limits of docs/design.md#message-limits, spelled out independently of the code under test."""
    immunity = (properties or {}).get(CHECK_IMMUNITY_TIME_IN_SECONDS)
    return (isinstance(topic, str) and 0 < len(topic) <= 127 and re.fullmatch(r"[a-zA-Z0-9_-]+", topic) is not None
            and 0 < len(body) <= MAX_BODY_BYTES
            and (immunity is None or (re.fullmatch(r"[0-9]+", immunity) is not None and 0 < int(immunity) <= 7 * 24 * 3600)))


@settings(max_examples=300, deadline=None)
@given(topic=topics, body=st.one_of(st.binary(max_size=16), st.just(b"x" * (MAX_BODY_BYTES + 1))),
       keys=st.one_of(st.none(), st.text(max_size=8)), properties=properties)
def test_every_message_is_sent_or_refused_with_a_reason(topic, body, keys, properties):
    accepted = accepted_by_producer(Message(topic, body, keys=keys, properties=properties))
    assert accepted == follows_the_rules(topic, body, properties)


def run_commits(checker: ManualChecker, commits: list[list[dict]], log: str | None = None) -> None:
    """Write each commit (to ``log``, by default its first record's group's) and run the checker after it."""
    for rows in commits:
        checker.write(*rows, log=log)
        checker.run()


@pytest.fixture(scope="module")
def fresh_checker(tmp_path_factory):
    """A new lakehouse for each generated example."""
    from coordinator.config import CoordinatorConfig
    from coordinator.lakehouse import init_lakehouse

    def make() -> ManualChecker:
        lakehouse = str(tmp_path_factory.mktemp("fuzz") / "lakehouse")
        init_lakehouse(lakehouse)
        return ManualChecker(CoordinatorConfig(lakehouse=lakehouse))

    return make


message_fields = st.fixed_dictionaries({
    "topic": topics, "body": st.one_of(st.binary(max_size=8), st.just(b"x" * (MAX_BODY_BYTES + 1))),
    "keys": st.one_of(st.none(), st.text(max_size=4)), "properties": properties,
})


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                                HealthCheck.data_too_large])
@given(messages=st.lists(message_fields, min_size=1, max_size=25))
def test_the_checker_accepts_exactly_what_the_producer_accepts(fresh_checker, messages):
    checker = fresh_checker()
    expected = {}
    rows = []
    for fields in messages:
        transaction_id = uuid.uuid4().hex
        expected[transaction_id] = accepted_by_producer(Message(**fields))
        rows.append(half_record(transaction_id, **fields))
    run_commits(checker, [rows])
    ingested = {r.transaction_id for r in checker.rows("half")}
    assert ingested == {t for t, ok in expected.items() if ok}
    refused = {r.transaction_id: r.reason for r in checker.rows("rejected")}
    assert set(refused) == {t for t, ok in expected.items() if not ok} and all(refused.values())


KINDS = ["HALF", "END", "half", "", None, "PURGE"]
STATES = ["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW", "UNKNOWN", "COMMIT", None]
hostile_record = st.fixed_dictionaries({
    "record_id": st.one_of(st.just(None), st.builds(lambda: uuid.uuid4().hex)),
    "kind": st.sampled_from(KINDS),
    "transaction_id": st.sampled_from(["t0", "t1", "t2", "canary-0", None, ""]),  # collisions on purpose
    "producer_group": st.sampled_from(["g", "forged", "", None]),
    "msg_id": st.sampled_from(["m", None]),
    "message_index": st.sampled_from([0, 1, -1, None]),
    "message_count": st.sampled_from([1, 2, 0, None]),
    "topic": topics,
    "body": st.sampled_from([b"b", b"", None]),
    "properties": properties,
    "state": st.sampled_from(STATES),
    "check_id": st.sampled_from([None, "c-1", "operator-x"]),  # an operator's decision outside the operators' log
})


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                                HealthCheck.data_too_large])
@given(commits=st.lists(st.lists(hostile_record, min_size=1, max_size=12), min_size=1, max_size=3))
def test_hostile_records_are_refused_with_reasons_and_valid_traffic_is_unaffected(fresh_checker, commits):
    checker = fresh_checker()
    canaries = [f"canary-{i}" for i in range(1, 4)]  # "canary-0" may be claimed by hostile records
    patient = {CHECK_IMMUNITY_TIME_IN_SECONDS: "600"}  # slow batches must not make their ENDs late
    first = [half_record(c, topic="CANARY", body=c.encode(), properties=patient) for c in canaries]
    last = [end_record(c) for c in canaries]
    # Group g's own log, the only one g may write: valid ENDs share a commit with hostile rows, some naming other groups.
    run_commits(checker, [first, *commits[:-1], commits[-1] + last], log="groups/g/commit_log")

    delivered = sorted(r.transaction_id for r in checker.rows("CANARY") if r.transaction_id in canaries)
    assert delivered == canaries
    written = [row for rows in commits for row in rows]
    rejected = {r.record_id: r.reason for r in checker.rows("rejected") if r.record_id is not None}
    assert all(rejected.values())
    resolving = {r.end_record_id for r in checker.rows("op")}
    half_rows = len(checker.rows("half"))
    for row in written:
        if row["record_id"] is None:
            continue
        if row["kind"] not in ("HALF", "END"):
            assert row["record_id"] in rejected
        elif row["kind"] == "END" and row["record_id"] not in rejected and row["record_id"] not in resolving:
            assert row["state"] == "UNKNOW"  # a valid "don't know yet" changes nothing
    accepted_halves = [r for r in written if r["kind"] == "HALF" and r["record_id"] not in rejected]
    assert half_rows == len(first) + sum(1 for r in accepted_halves if r["record_id"] is not None)
    # Only committed transactions reach topics, each message once.
    outcomes = {r.transaction_id: r.outcome for r in checker.rows("op")}
    lakehouse = checker.config.lakehouse
    for topic in os.listdir(os.path.join(lakehouse, "topics")):
        for row in checker.rows(topic):
            assert outcomes[row.transaction_id] == "COMMIT"
        keys = [(r.transaction_id, r.queue_offset) for r in checker.rows(topic)]
        assert len(keys) == len(set(keys))
    assert sorted(os.listdir(lakehouse)) == ["groups", "operators", "system", "topics"]
    assert os.listdir(os.path.join(lakehouse, "groups")) == ["g"]  # no table for a group named by a forged record
