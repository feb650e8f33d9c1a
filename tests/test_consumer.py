"""TopicConsumer against real Delta topics, with no JVM: delivery, order, shares, failover, retries, dead
letters, timeouts. Every deadline runs on a clock the test moves (tests/support/clock.py); the test waits only
for what the consumer's threads do, never for time to pass."""

from __future__ import annotations

import threading

import pytest

from coordinator import ConsumeResult, ConsumedMessage, CoordinatorConfig, MessageListener, TopicConsumer
from coordinator.consumer.group import ConsumerGroup, share_of
from coordinator.exceptions import AccessDeniedError, IncompleteListenerError, MessageValidationError
from coordinator.lakehouse import Lakehouse, read_table
from tests.support.clock import Clock
from tests.support.consumers import RecordingListener, TopicFeed, grant
from tests.support.waiting import wait_until


@pytest.fixture
def settings(tmp_path) -> CoordinatorConfig:
    return CoordinatorConfig(lakehouse=str(tmp_path / "lakehouse"), consumer_heartbeat_ms=1000,
                             consumer_poll_interval_ms=5, consumer_commit_interval_ms=1000,
                             consumer_retry_delays_ms=(10_000, 30_000), consumer_max_attempts=3,
                             consumer_timeout_ms=60_000, consumer_threads=4)


@pytest.fixture
def feed(settings):
    feed = TopicFeed(settings)
    yield feed
    feed.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def handled_count(listener, count):
    return lambda: len(listener.handled) >= count


def test_one_instance_consumes_every_message_once_in_order_of_each_key(settings, feed, clock):
    grant(settings, "credits", ["ORDERS"])
    sent = [("k1", b"a1"), ("k2", b"b1"), (None, b"n1"), ("k1", b"a2")]
    feed.deliver("ORDERS", sent)
    feed.deliver("ORDERS", [("k2", b"b2"), ("k1", b"a3")])
    listener = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock):
        wait_until(handled_count(listener, 6), 30, "six messages handled")
    assert sorted(listener.bodies()) == [b"a1", b"a2", b"a3", b"b1", b"b2", b"n1"]
    by_key = {}
    for message in listener.handled:
        by_key.setdefault(message.keys, []).append(message.body)
    assert by_key["k1"] == [b"a1", b"a2", b"a3"] and by_key["k2"] == [b"b1", b"b2"]
    first = next(m for m in listener.handled if m.body == b"a1")
    assert isinstance(first, ConsumedMessage)
    assert (first.topic, first.keys, first.delivery_attempt, first.topic_version) == ("ORDERS", "k1", 1, 0)
    assert first.properties == {"p": "v"} and first.queue_offset == 0 and first.commit_timestamp is not None
    # Closed, it saved its place: a new instance of the group hands nothing again, and takes what is new.
    feed.deliver("ORDERS", [("k3", b"c1")])
    again = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], again, settings, clock=clock):
        wait_until(handled_count(again, 1), 30, "the new message")
    assert again.bodies() == [b"c1"]


def test_a_group_not_granted_a_topic_is_refused_naming_the_grant(settings, feed):
    feed.deliver("ORDERS", [("k", b"x")])
    with pytest.raises(AccessDeniedError, match=r"no grant.*txcoord add-consumer-group credits --topics ORDERS"):
        TopicConsumer("credits", ["ORDERS"], RecordingListener(), settings).start()
    grant(settings, "credits", ["AUDIT_*"])
    with pytest.raises(AccessDeniedError, match=r"may not read topic 'ORDERS'.*_grant.json\) names AUDIT_\*"):
        TopicConsumer("credits", ["AUDIT_EU", "ORDERS"], RecordingListener(), settings).start()
    assert not Lakehouse.of(settings).files.list("consumers/credits/_instances")


def test_bad_names_and_listeners_are_refused_at_the_edge(settings):
    with pytest.raises(MessageValidationError, match="consumer group"):
        TopicConsumer("a/b", ["T"], RecordingListener(), settings)
    with pytest.raises(MessageValidationError, match="topic"):
        TopicConsumer("g", ["T.x"], RecordingListener(), settings)

    class Lazy(MessageListener):
        pass

    with pytest.raises(IncompleteListenerError):
        Lazy()
