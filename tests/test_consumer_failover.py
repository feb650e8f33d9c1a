"""A consumer group's shares after a double hold and after an instance dies: on a local disk and on the S3 server,
with real Delta topics and real TopicConsumers. Every deadline runs on a clock the test moves (support/clock.py);
the test waits only for what the consumers' threads do, never for time to pass."""

from __future__ import annotations

import threading

import pytest

from coordinator import ConsumeResult, CoordinatorConfig, TopicConsumer
from coordinator.consumer.group import ConsumerGroup, ShareProgress, share_of, share_owners
from coordinator.lakehouse import Lakehouse
from support.clock import Clock
from support.consumers import RecordingListener, TopicFeed, grant
from support.waiting import wait_until
from tests.test_consumer import tick

SHARES = 2


@pytest.fixture(params=["local", "s3"])
def settings(request, tmp_path) -> CoordinatorConfig:
    if request.param == "local":
        where = {"lakehouse": str(tmp_path / "lakehouse")}
    else:
        lakehouse = request.getfixturevalue("s3_lakehouse")
        where = {"lakehouse": lakehouse.root, "storage": lakehouse.storage}
    # Progress saved only when a share is handed over: the test says when a save happens.
    return CoordinatorConfig(**where, consumer_heartbeat_ms=1000, consumer_poll_interval_ms=5,
                             consumer_commit_interval_ms=3_600_000, consumer_timeout_ms=60_000, consumer_threads=4)


@pytest.fixture
def feed(settings):
    feed = TopicFeed(settings)
    yield feed
    feed.close()


def keys_of_share(share, count):
    """``count`` keys whose messages fall in ``share`` of the topic."""
    keys = (f"key-{n}" for n in range(10_000))
    return [key for key in keys if share_of(key, "", SHARES) == share][:count]


def wait_taken(clock, consumers, group, rounds=10):
    """Move the clock half a heartbeat at a time until the last of ``consumers`` holds share 1 (a few looks)."""
    for _ in range(rounds):
        if ("ORDERS", 1) in consumers[-1].shares:
            return
        tick(clock, consumers)
    raise AssertionError(f"share 1 not taken after {rounds} looks: its claim names {group.share_owner('ORDERS', 1)}")


def test_a_share_whose_save_was_refused_is_released_and_taken_by_the_instance_hashing_names(settings, feed):
    """The stall of docs/known-limits.md: an instance whose progress write is refused (another instance held the
    share meanwhile: a double hold) drops the share. Its claim, left naming it, a live instance, was never
    replaced by the instance the shares' hashing names, and the share stalled until the first instance stopped."""
    clock = Clock()
    grant(settings, "credits", ["ORDERS"], shares=SHARES)
    a_listener, b_listener = RecordingListener(), RecordingListener()
    a = TopicConsumer("credits", ["ORDERS"], a_listener, settings, clock=clock)
    b = TopicConsumer("credits", ["ORDERS"], b_listener, settings, clock=clock)
    live = {a.instance_id, b.instance_id}
    while share_owners("credits", "ORDERS", SHARES, live)[1] != b.instance_id:  # b is to take share 1 from a
        b = TopicConsumer("credits", ["ORDERS"], b_listener, settings, clock=clock)
        live = {a.instance_id, b.instance_id}
    a.start()
    try:
        first = keys_of_share(1, 3)
        feed.deliver("ORDERS", [(key, key.encode()) for key in first])
        wait_until(lambda: len(a_listener.handled) >= 3, 60, "a handling share 1's first messages")
        # The instance that held share 1 meanwhile (its claim had replaced a's while a's record looked stale, and
        # a's replaced its own back) saved the share's progress: a's next save of it is refused.
        other = ConsumerGroup(Lakehouse.of(settings), "credits", clock=clock)
        assert other.save_progress("ORDERS", 1, ShareProgress(version=0), None, "the-other-instance") is not None
        b.start()
        # a hands share 1 over to b: its save is refused, it drops the share, and its claim must not stay.
        wait_taken(clock, [a, b], other)
        assert ("ORDERS", 1) not in a.shares
        later = keys_of_share(1, 5)[3:]
        feed.deliver("ORDERS", [(key, key.encode()) for key in later])
        # b starts where the other instance saved (version 0): a's three again, then the new ones.
        wait_until(lambda: len(b_listener.handled) >= 5, 60, "b handling share 1")
        assert b_listener.bodies() == [key.encode() for key in first + later]
    finally:
        a.close()
        b.close()


def test_a_release_leaves_a_claim_another_instance_wrote_since(settings):
    """A release is a replace conditional on the claim's version its instance holds: a claim another instance
    wrote since (taking the share of an instance it took for dead) is left in place; a released claim is
    taken by the next instance at once, its releaser live or not."""
    clock = Clock()
    group = ConsumerGroup(Lakehouse.of(settings), "credits", clock=clock)
    group.instances.announce("credits", "a", heartbeat_s=1.0)
    group.instances.announce("credits", "b", heartbeat_s=1.0)
    claim_a = group.claim_share("ORDERS", 0, "a", live={"a"})
    assert claim_a is not None
    later = ConsumerGroup(Lakehouse.of(settings), "credits", clock=lambda: clock.now + 2.5)  # a looks dead to it
    assert later.claim_share("ORDERS", 0, "c", live={"c"}) is not None
    assert not group.release_share("ORDERS", 0, "a", claim_a)
    assert group.share_owner("ORDERS", 0) == "c"
    claim_b = group.claim_share("ORDERS", 1, "b", live={"a", "b"})
    assert group.release_share("ORDERS", 1, "b", claim_b)
    assert group.share_owner("ORDERS", 1) is None
    assert group.claim_share("ORDERS", 1, "a", live={"a", "b"}) is not None  # b is live: its claim is released
    assert group.share_owner("ORDERS", 1) == "a"


def test_a_share_with_few_messages_is_served_while_another_has_many(settings, feed):
    """The free listener threads go round the shares: a share taken over from a dead instance is handled at once,
    not after every message of the shares held before it (at 25 ms a request, a survivor behind on its own shares
    handled nothing of the dead one's for minutes)."""
    clock = Clock()
    settings = settings.replace(consumer_threads=1)
    grant(settings, "credits", ["ORDERS"], shares=SHARES)
    gate = threading.Event()

    def held(message):
        gate.wait(60)
        return ConsumeResult.SUCCESS

    listener = RecordingListener(held)
    busy, quiet = keys_of_share(0, 30), keys_of_share(1, 1)
    feed.deliver("ORDERS", [(key, key.encode()) for key in busy + quiet])  # one version: both shares read at once
    consumer = TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock).start()
    try:
        wait_until(lambda: len(listener.handled) >= 1, 60, "the first call")  # held until the gate opens
        gate.set()
        wait_until(lambda: len(listener.handled) >= 31, 60, "every message")
        order = [message.keys for message in listener.handled]
        assert order.index(quiet[0]) <= 2, order
    finally:
        gate.set()
        consumer.close()


def test_a_share_claimed_but_not_taken_is_released(settings, feed):
    """An instance that claimed a share and could not read its progress (here a record that is not one) releases
    the claim: once the record is mended and another instance is the one hashing names, that one takes the share.
    A claim kept would name a live instance that does not handle the share, and bar it."""
    clock = Clock()
    grant(settings, "credits", ["ORDERS"], shares=SHARES)
    a_listener, b_listener = RecordingListener(), RecordingListener()
    a = TopicConsumer("credits", ["ORDERS"], a_listener, settings, clock=clock)
    b = TopicConsumer("credits", ["ORDERS"], b_listener, settings, clock=clock)
    while share_owners("credits", "ORDERS", SHARES, {a.instance_id, b.instance_id})[1] != b.instance_id:
        b = TopicConsumer("credits", ["ORDERS"], b_listener, settings, clock=clock)
    group = ConsumerGroup(Lakehouse.of(settings), "credits", clock=clock)
    group.files.put("consumers/credits/progress/ORDERS/1.json", b"not a progress record")
    a.start()
    try:
        tick(clock, [a])  # a claims share 1, cannot read its progress, and does not try it again
        assert ("ORDERS", 1) not in a.shares and "ORDERS/1" in a.health().stopped_shares
        group.files.put("consumers/credits/progress/ORDERS/1.json",  # mended, as an operator's reset would
                        ShareProgress(version=0).to_json("tester@test", clock()))
        b.start()
        wait_taken(clock, [a, b], group)
        keys = keys_of_share(1, 2)
        feed.deliver("ORDERS", [(key, key.encode()) for key in keys])
        wait_until(lambda: len(b_listener.handled) >= 2, 60, "b handling share 1")
    finally:
        a.close()
        b.close()
