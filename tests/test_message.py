"""Edge validation of messages, and the local-transaction states."""

import pytest

from coordinator.exceptions import MessageValidationError
from coordinator.producer.message import Message
from coordinator.protocol import LocalTransactionState
from coordinator.validation import MAX_BODY_BYTES, MAX_IMMUNITY_SECONDS, validate_topic


@pytest.mark.parametrize("topic", ["ORDER_TOPIC", "a", "RETRY_order-group-1", "x" * 127])
def test_valid_topics_pass(topic):
    assert validate_topic(topic) == topic
    Message(topic, b"x").validate()


@pytest.mark.parametrize("topic", ["../x", "a/b", "x" * 128, "x" * 200, "", "with space", "dot.ted", None, 42,
                                   "%RETRY%order|group-1", "CAROL_%2F%2E%2E%2FPAYMENTS"])
def test_invalid_topics_are_refused(topic):
    with pytest.raises(MessageValidationError):
        Message(topic, b"x").validate()


@pytest.mark.parametrize("body", [b"", b"x" * (MAX_BODY_BYTES + 1), "text", None, 42])
def test_bad_bodies_are_refused(body):
    with pytest.raises(MessageValidationError):
        Message("T", body).validate()


def test_body_of_the_maximum_size_passes_and_is_normalised_to_bytes():
    Message("T", b"x" * MAX_BODY_BYTES).validate()
    msg = Message("T", bytearray(b"abc"))
    msg.validate()
    assert type(msg.body) is bytes and msg.body == b"abc"


@pytest.mark.parametrize("field", ["keys", "tags"])
def test_keys_and_tags_must_be_strings(field):
    with pytest.raises(MessageValidationError):
        Message("T", b"x", **{field: 42}).validate()


@pytest.mark.parametrize("properties", [{"k": 1}, {1: "v"}, {"k": None}])
def test_properties_must_map_strings_to_strings(properties):
    with pytest.raises(MessageValidationError):
        Message("T", b"x", properties=properties).validate()


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "", str(MAX_IMMUNITY_SECONDS + 1)])
def test_bad_immunity_values_are_refused(value):
    with pytest.raises(MessageValidationError, match="CHECK_IMMUNITY_TIME_IN_SECONDS"):
        Message("T", b"x", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": value}).validate()


@pytest.mark.parametrize("value", ["1", "10", str(MAX_IMMUNITY_SECONDS)])
def test_good_immunity_values_pass(value):
    msg = Message("T", b"x", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": value})
    msg.validate()
    assert msg.get_property("CHECK_IMMUNITY_TIME_IN_SECONDS") == value


def test_delay_properties_are_cleared_and_the_callers_dict_is_left_alone():
    given = {"DELAY": "3", "TIMER_DELIVER_MS": "1", "TIMER_DELAY_SEC": "1", "TIMER_DELAY_MS": "1", "region": "eu"}
    msg = Message("T", b"x", properties=given)
    msg.validate()
    assert msg.properties == {"region": "eu"}
    assert "DELAY" in given


def test_unknown_is_an_alias_of_unknow():
    assert LocalTransactionState.UNKNOWN is LocalTransactionState.UNKNOW
    assert LocalTransactionState.UNKNOWN.value == "UNKNOW"


@pytest.mark.parametrize(
    "value, expected",
    [
        (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.COMMIT_MESSAGE),
        ("COMMIT_MESSAGE", LocalTransactionState.COMMIT_MESSAGE),
        ("ROLLBACK_MESSAGE", LocalTransactionState.ROLLBACK_MESSAGE),
        ("UNKNOW", LocalTransactionState.UNKNOW),
        (None, LocalTransactionState.UNKNOW),
        ("garbage", LocalTransactionState.UNKNOW),
        (True, LocalTransactionState.UNKNOW),
    ],
)
def test_coerce_reads_listener_answers(value, expected):
    assert LocalTransactionState.coerce(value) is expected
