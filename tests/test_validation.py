"""The message rules in their two forms: the producer's (one message) and the checker's (a batch's columns)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from coordinator.exceptions import MessageValidationError
from coordinator.names import NAME_MAX_LENGTH, NAME_PATTERN, is_name, validate_name
from coordinator.validation import (MAX_BODY_BYTES, MAX_IMMUNITY_SECONDS, message_refusals, parse_immunity_seconds,
                                    validate_body, validate_topic)

_WELL_FORMED = dict(record_id="r", transaction_id="t", producer_group="g", msg_id="m", topic="T", body_size=5,
                    message_index=0, message_count=1, properties=None)


def _records(*overrides: dict) -> pa.Table:
    rows = [_WELL_FORMED | override for override in overrides]
    types = {"body_size": pa.int32(), "message_index": pa.int32(), "message_count": pa.int32(),
             "properties": pa.map_(pa.string(), pa.string())}
    return pa.table({name: pa.array([row[name] for row in rows], types.get(name, pa.string())) for name in _WELL_FORMED})


@pytest.mark.parametrize("override, reason", [
    ({}, None),
    ({"record_id": None}, "missing record_id"),
    ({"transaction_id": "   "}, "missing transaction_id"),
    ({"producer_group": None, "topic": None}, "missing producer_group"),  # the first rule broken gives the reason
    ({"topic": "x" * (NAME_MAX_LENGTH + 1)}, f"topic longer than {NAME_MAX_LENGTH} characters"),
    ({"topic": "T\n"}, f"topic does not match {NAME_PATTERN}"),
    ({"topic": "a/../b"}, f"topic does not match {NAME_PATTERN}"),
    ({"topic": "CAROL_%2F%2E%2E%2FPAYMENTS"}, f"topic does not match {NAME_PATTERN}"),  # decoded again by the table layer
    ({"topic": "A|B"}, f"topic does not match {NAME_PATTERN}"),
    ({"transaction_id": "t/../x"}, f"transaction_id does not match {NAME_PATTERN}"),
    ({"msg_id": "m" * (NAME_MAX_LENGTH + 1)}, f"msg_id longer than {NAME_MAX_LENGTH} characters"),
    ({"producer_group": "g%2Fh"}, f"producer_group does not match {NAME_PATTERN}"),
    ({"body_size": 0}, "empty body"),
    ({"body_size": None}, "empty body"),
    ({"body_size": MAX_BODY_BYTES + 1}, f"body larger than {MAX_BODY_BYTES} bytes"),
    ({"message_index": 1, "message_count": 1}, "bad message_index/message_count"),
    ({"message_index": None}, "bad message_index/message_count"),
    ({"properties": [("CHECK_IMMUNITY_TIME_IN_SECONDS", "0")]}, "bad CHECK_IMMUNITY_TIME_IN_SECONDS"),
    ({"properties": [("CHECK_IMMUNITY_TIME_IN_SECONDS", "٣")]}, "bad CHECK_IMMUNITY_TIME_IN_SECONDS"),
    ({"properties": [("CHECK_IMMUNITY_TIME_IN_SECONDS", str(MAX_IMMUNITY_SECONDS + 1))]}, "bad CHECK_IMMUNITY_TIME_IN_SECONDS"),
    ({"properties": [("CHECK_IMMUNITY_TIME_IN_SECONDS", "10"), ("CHECK_IMMUNITY_TIME_IN_SECONDS", "x")]}, None),  # the first
    ({"properties": [("CHECK_IMMUNITY_TIME_IN_SECONDS", str(MAX_IMMUNITY_SECONDS))]}, None),
])
def test_the_checker_gives_each_record_the_reason_of_the_first_rule_it_breaks(override, reason):
    assert message_refusals(_records(_WELL_FORMED, override, _WELL_FORMED)).to_pylist() == [None, reason, None]


@pytest.mark.parametrize("topic", ["T", "a" * (NAME_MAX_LENGTH + 1), "T\n", "a/b", "", "%|_-", "a_-Z9"])
@pytest.mark.parametrize("body_size", [1, 0, MAX_BODY_BYTES, MAX_BODY_BYTES + 1])
@pytest.mark.parametrize("immunity", [None, "1", "0", "1.5", " 1", str(MAX_IMMUNITY_SECONDS + 1)])
def test_a_record_is_refused_exactly_when_the_producer_refuses_its_message(topic, body_size, immunity):
    properties = None if immunity is None else [("CHECK_IMMUNITY_TIME_IN_SECONDS", immunity)]
    try:
        validate_topic(topic), validate_body(b"x" * body_size), parse_immunity_seconds(immunity)
        producer_refuses = False
    except MessageValidationError:
        producer_refuses = True
    [reason] = message_refusals(_records({"topic": topic, "body_size": body_size, "properties": properties})).to_pylist()
    assert (reason is not None) == producer_refuses, reason


@pytest.mark.parametrize("name", ["order_group", "A-1", "x" * NAME_MAX_LENGTH, "a/b", "..", "%2E", "a|b", "x" * 128, "T\n",
                                  "", None, "ÄRGER", "a b"])
def test_one_name_rule_for_every_name_that_becomes_a_path(name):
    follows = isinstance(name, str) and 0 < len(name) <= 127 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
    assert is_name(name) == follows
    if follows:
        assert validate_name("producer group", name) == name
    else:
        with pytest.raises(MessageValidationError, match="producer group"):
            validate_name("producer group", name)
