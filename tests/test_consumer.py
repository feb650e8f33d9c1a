"""TopicConsumer against real Delta topics, with no JVM: delivery, order, shares, failover, retries, dead
letters, timeouts. Every deadline runs on a clock the test moves (support/clock.py); the test waits only
for what the consumer's threads do, never for time to pass."""

from __future__ import annotations

import threading

import pytest

from coordinator import ConsumeResult, ConsumedMessage, CoordinatorConfig, MessageListener, TopicConsumer
from coordinator.consumer.group import REDRIVE_SOURCE, ConsumerGroup, share_of, share_owners
from coordinator.consumer.topic_log import TopicLog
from coordinator.exceptions import AccessDeniedError, IncompleteListenerError, MessageValidationError
from coordinator.lakehouse import Lakehouse, init_lakehouse, read_table
from support.clock import Clock
from support.consumers import RecordingListener, TopicFeed, grant
from support.waiting import wait_until


def consumer_settings(tmp_path) -> CoordinatorConfig:
    """A lakehouse in ``tmp_path`` and consumer settings fit for a clock a test moves: a heartbeat of 1 s."""
    return CoordinatorConfig(lakehouse=str(tmp_path / "lakehouse"), consumer_heartbeat_ms=1000,
                             consumer_poll_interval_ms=5, consumer_commit_interval_ms=1000,
                             consumer_retry_delays_ms=(10_000, 30_000), consumer_max_attempts=3,
                             consumer_timeout_ms=60_000, consumer_threads=4)


@pytest.fixture
def settings(tmp_path) -> CoordinatorConfig:
    return consumer_settings(tmp_path)


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


def test_a_versions_shares_are_its_rows_split_by_key_each_in_offset_order(settings, feed):
    messages = [(f"k{n % 7}", b"%d" % n) for n in range(60)] + [(None, b"keyless"), (None, b"keyless too")]
    feed.deliver("ORDERS", messages, offsets=list(range(100, 38, -1)))  # written out of offset order
    log = TopicLog(Lakehouse.of(settings).files, "topics/ORDERS")
    shares = [log.share_rows(0, number, 4, share_of) for number in range(4)]
    whole = log.rows(0)
    assert [row["queue_offset"] for row in whole] == list(range(39, 101))
    for number, rows in enumerate(shares):
        assert [row["queue_offset"] for row in rows] == sorted(row["queue_offset"] for row in rows)
        assert all(share_of(row["keys"], row["msg_id"], 4) == number for row in rows)
    assert sorted((row["queue_offset"], row["msg_id"], row["body"]) for rows in shares for row in rows) == \
        [(row["queue_offset"], row["msg_id"], row["body"]) for row in whole]


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


def retry_state(settings, group, topic, message, shares=4):
    """The saved retry state of ``message`` (a ConsumedMessage), or None."""
    progress, _ = ConsumerGroup(Lakehouse.of(settings), group).progress(topic, share_of(message.keys, message.msg_id, shares))
    return None if progress is None else progress.retrying.get((message.topic_version, message.queue_offset))


def calls(listener, body):
    with listener.lock:
        return [m for m in listener.handled if m.body == body]


def test_a_failure_is_delivered_again_after_its_delay_its_key_waiting_other_keys_going_on(settings, feed, clock):
    grant(settings, "credits", ["ORDERS"])
    feed.deliver("ORDERS", [("K", b"x"), ("K", b"y"), ("J", b"z")])
    answers = {b"x": [ConsumeResult.FAILURE, RuntimeError("db down")]}

    def answer(message):
        pending = answers.get(message.body)
        outcome = pending.pop(0) if pending else ConsumeResult.SUCCESS
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    listener = RecordingListener(answer)
    consumer = TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock).start()
    wait_until(lambda: calls(listener, b"z"), 30, "the other key's message")
    x = wait_until(lambda: calls(listener, b"x"), 30, "x's first attempt")[0]
    state = wait_until(lambda: retry_state(settings, "credits", "ORDERS", x), 30, "x's failure saved")
    assert state["attempts"] == 1 and state["error"] == "the listener returned FAILURE"
    assert state["due_ms"] == int(clock.now * 1000) + 10_000
    assert calls(listener, b"y") == []  # its key waits for x
    tick(clock, [consumer], 10)
    wait_until(lambda: (retry_state(settings, "credits", "ORDERS", x) or {}).get("attempts") == 2, 30, "x's second")
    assert retry_state(settings, "credits", "ORDERS", x)["error"] == "the listener raised RuntimeError: db down"
    consumer.close()
    # The attempts are saved: another instance goes on counting, after the ladder's next delay (30 s).
    listener2 = RecordingListener(answer)
    with TopicConsumer("credits", ["ORDERS"], listener2, settings, clock=clock) as consumer2:
        tick(clock, [consumer2], 30.5)
        wait_until(lambda: calls(listener2, b"y"), 30, "y, once x succeeded")
    assert [m.delivery_attempt for m in calls(listener, b"x") + calls(listener2, b"x")] == [1, 2, 3]
    assert [m.body for m in listener2.handled] == [b"x", b"y"]


def test_after_its_last_attempt_a_message_is_a_dead_letter_and_its_key_goes_on(settings, feed, clock):
    grant(settings, "credits", ["ORDERS"])
    feed.deliver("ORDERS", [("K", b"poison"), ("K", b"next")])
    listener = RecordingListener(lambda m: ConsumeResult.FAILURE if m.body == b"poison" else ConsumeResult.SUCCESS)
    with TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock) as consumer:
        poison = wait_until(lambda: calls(listener, b"poison"), 30, "the first attempt")[0]
        for attempts, delay in ((1, 10), (2, 30)):
            wait_until(lambda: (retry_state(settings, "credits", "ORDERS", poison) or {}).get("attempts") == attempts,
                       30, f"attempt {attempts} saved")
            tick(clock, [consumer], delay)
        wait_until(lambda: calls(listener, b"next"), 30, "the key's next message")
    assert [m.delivery_attempt for m in calls(listener, b"poison")] == [1, 2, 3]
    dead = read_table(Lakehouse.of(settings).consumer_table("credits", "dead_letters")).to_pylist()
    assert [(d["msg_id"], d["attempts"], d["last_error"], d["body"]) for d in dead] == [
        (poison.msg_id, 3, "the listener returned FAILURE", b"poison")]
    assert dead[0]["dead_letter_id"] == f"ORDERS.0.{poison.queue_offset}.{poison.msg_id}.0"
    assert dead[0]["topic_version"] == 0
    assert retry_state(settings, "credits", "ORDERS", poison) is None


def test_a_listener_answering_something_else_fails_its_message_with_the_reason(settings, feed, clock):
    grant(settings, "credits", ["ORDERS"])
    feed.deliver("ORDERS", [("K", b"x")])
    listener = RecordingListener(lambda m: True)
    with TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock):
        x = wait_until(lambda: calls(listener, b"x"), 30, "x")[0]
        state = wait_until(lambda: retry_state(settings, "credits", "ORDERS", x), 30, "x's failure saved")
    assert state["error"] == "the listener returned True (bool), not a ConsumeResult"


def test_a_hung_call_times_out_its_thread_is_replaced_and_the_others_go_on(settings, feed, clock):
    settings = settings.replace(consumer_threads=1)
    grant(settings, "credits", ["ORDERS"])
    feed.deliver("ORDERS", [("K", b"hang")])
    release = threading.Event()
    listener = RecordingListener(lambda m: release.wait(60) and ConsumeResult.SUCCESS if m.body == b"hang"
                                 else ConsumeResult.SUCCESS)
    try:
        with TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock) as consumer:
            hung = wait_until(lambda: calls(listener, b"hang"), 30, "the call that hangs")[0]
            feed.deliver("ORDERS", [("J", b"other")])
            wait_until(lambda: consumer_read(consumer, 2), 30, "the other message read")
            assert calls(listener, b"other") == []  # its one thread is taken
            tick(clock, [consumer], 61)
            state = wait_until(lambda: retry_state(settings, "credits", "ORDERS", hung), 30, "the timeout saved")
            assert state["error"] == "the listener did not answer within consumer_timeout_ms (60000 ms)"
            wait_until(lambda: calls(listener, b"other"), 30, "the other key, on the new thread")
    finally:
        release.set()


def consumer_read(consumer, count):
    """Whether ``consumer`` has read ``count`` messages of its shares (handled or not)."""
    return sum(share.read_count for share in list(consumer._shares.values())) >= count


def tick(clock, consumers, seconds=0.5):
    """Move the clock, half a heartbeat at a time at most, and after each move wait until each consumer has gone
    twice round its loop and its heartbeat's at the new time (a longer jump is a pause to them: they stop until they prove their
    hold on their shares again)."""
    while True:
        step = min(seconds, 0.5)
        before = [(consumer._steps, consumer._membership.rounds) for consumer in consumers]
        clock.now += step
        wait_until(lambda: all(c._steps >= steps + 2 and c._membership.rounds >= rounds + 2
                               for c, (steps, rounds) in zip(consumers, before)), 30,
                   "the consumers' next rounds (their loops' and their heartbeats')", poll_s=0.005)
        seconds -= step
        if seconds <= 0:
            return


def shares_split(consumers, shares):
    """The shares each of ``consumers`` should hold while they are their group's live instances."""
    live = {consumer.instance_id for consumer in consumers}
    owners = {source: share_owners(consumers[0].group, source, shares, live) for source in ("ORDERS", REDRIVE_SOURCE)}
    return [{(source, n) for source in owners for n in range(shares) if owners[source][n] == consumer.instance_id}
            for consumer in consumers]


def wait_split(clock, consumers, shares):
    """Move the clock half a heartbeat at a time until each of ``consumers`` holds exactly the shares it should:
    waiting for each to hold some could pass while a share is still being handed over."""
    expected = shares_split(consumers, shares)
    for _ in range(20):
        held = [set(consumer.shares) for consumer in consumers]
        if held == expected:
            return held
        tick(clock, consumers)
    raise AssertionError(f"the shares were not split as share_owners says: held {held}, expected {expected}")


@pytest.mark.parametrize("instances", [1, 2, 3, 5, 16, 20])
def test_every_instance_works_out_the_same_owners_and_none_holds_more_than_its_part(instances):
    live = [f"instance-{n}" for n in range(instances)]
    owners = share_owners("credits", "ORDERS", 16, live)
    assert share_owners("credits", "ORDERS", 16, reversed(live)) == owners
    held = [owners.count(instance) for instance in live]
    assert sum(held) == 16 and set(held) <= {16 // instances, -(-16 // instances)}
    assert share_owners("credits", "ORDERS", 16, []) == [None] * 16


def test_two_instances_split_the_shares_and_a_dead_ones_move_to_the_live_one(settings, feed, clock):
    settings = settings.replace(consumer_commit_interval_ms=3_600_000)  # saved only when handed over
    grant(settings, "credits", ["ORDERS"], shares=4)
    a_listener, b_listener = RecordingListener(), RecordingListener()
    a = TopicConsumer("credits", ["ORDERS"], a_listener, settings, clock=clock)
    b = TopicConsumer("credits", ["ORDERS"], b_listener, settings, clock=clock)
    a.start()
    b.start()
    try:
        held_a, held_b = wait_split(clock, [a, b], 4)  # four shares of the topic, four of the redrive table
        keys = [f"key-{n}" for n in range(40)]
        feed.deliver("ORDERS", [(key, key.encode()) for key in keys])
        wait_until(lambda: len(a_listener.handled) + len(b_listener.handled) >= 40, 30, "every message")
        assert sorted(a_listener.bodies() + b_listener.bodies()) == sorted(key.encode() for key in keys)
        assert {share_of(m.keys, m.msg_id, 4) for m in a_listener.handled} <= {n for _, n in held_a}
        a._halt()  # kill -9: nothing saved, nothing withdrawn
        before = len(b_listener.handled)
        tick(clock, [b], 2.5)  # two heartbeats and a half: a is taken for dead
        wait_until(lambda: len(set(b.shares)) == 8, 30, "b holding every share")
        # What a handled and never saved is delivered again, by b; b's own messages are not.
        wait_until(lambda: len(b_listener.handled) >= before + len(a_listener.handled), 30, "a's messages again")
        assert sorted(b_listener.bodies()[before:]) == sorted(a_listener.bodies())
    finally:
        b.close()


def test_an_instance_owed_shares_another_holds_takes_them_soon_after_they_are_let_go(settings):
    grant(settings, "credits", ["ORDERS"], shares=4)
    clock_a, clock_b = Clock(), Clock()  # one each: b looks only when its own clock moves
    a = TopicConsumer("credits", ["ORDERS"], RecordingListener(), settings, clock=clock_a)
    b = TopicConsumer("credits", ["ORDERS"], RecordingListener(), settings, clock=clock_b)
    expected_a, expected_b = shares_split([a, b], 4)
    with a:
        wait_until(lambda: len(set(a.shares)) == 8, 30, "a, alone, holding every share")
        clock_b.now = clock_a.now
        with b:
            tick(clock_b, [b], 0)  # b's first look: its shares are held by a, which is live
            assert not set(b.shares)
            tick(clock_a, [a])  # a's next look finds b, and a lets b's shares go
            # a drops a share from its own set, then releases its claim: wait for the claims, which b reads.
            group = ConsumerGroup(Lakehouse.of(settings), "credits")
            wait_until(lambda: set(a.shares) == expected_a
                       and all(group.share_owner(source, n) != a.instance_id for source, n in expected_b), 30,
                       "a letting b's shares go")
            # Half a heartbeat (0.5 s) after its last look, b would look again; owed shares, it looks sooner.
            tick(clock_b, [b], 0.05)  # ten poll intervals, a tenth of half a heartbeat
            assert set(b.shares) == expected_b


def test_a_keys_messages_stay_in_order_when_its_share_moves_between_instances(settings, feed, clock):
    grant(settings, "credits", ["ORDERS"], shares=2)
    a_listener, b_listener = RecordingListener(), RecordingListener()
    sent = [f"m{n}".encode() for n in range(9)]
    feed.deliver("ORDERS", [("K", body) for body in sent[:3]])
    a = TopicConsumer("credits", ["ORDERS"], a_listener, settings, clock=clock).start()
    wait_until(handled_count(a_listener, 3), 30, "a's first three")
    b = TopicConsumer("credits", ["ORDERS"], b_listener, settings, clock=clock).start()
    try:
        feed.deliver("ORDERS", [("K", body) for body in sent[3:6]])
        wait_split(clock, [a, b], 2)
        feed.deliver("ORDERS", [("K", body) for body in sent[6:]])
        a.close()  # b takes every share, from where a saved them
        tick(clock, [b])
        wait_until(lambda: len(a_listener.handled) + len(b_listener.handled) >= 9, 30, "every message of the key")
        assert a_listener.bodies() + b_listener.bodies() == sent
    finally:
        b.close()


def test_on_object_storage_a_claim_written_after_the_survey_is_not_replaced(s3_lakehouse):
    """Two instances starting together: each surveyed the group before the other announced itself, so each one's
    live set holds only itself. A claim the other wrote since names an instance whose record is live now: it is
    kept, not replaced (the benchmark on the S3 server saw each replace the other's fresh claims)."""
    clock = Clock()
    first, second = (ConsumerGroup(s3_lakehouse, "credits", clock=clock) for _ in range(2))
    survey_of_second = {record.instance_id for record in second.instances.live("credits")} | {"b"}
    first.instances.announce("credits", "a", heartbeat_s=1.0)
    assert first.claim_share("ORDERS", 3, "a", live={"a"}) is not None
    assert survey_of_second == {"b"}
    assert second.claim_share("ORDERS", 3, "b", live=survey_of_second) is None
    assert second.share_owner("ORDERS", 3) == "a"
    clock.now += 2.5  # a's record is older than the liveness window now: its claim is free
    assert second.claim_share("ORDERS", 3, "b", live={"b"}) is not None
    assert second.share_owner("ORDERS", 3) == "b"


def test_on_object_storage_an_idle_group_costs_each_instance_the_same_whatever_its_size(s3_server):
    """An idle group's requests on S3 (issue 54: at most 4 a second and $0.25 a day an instance; issue 61: not
    growing with the group): once settled, an instance reads at each look its group's change token and its
    successor's record, lists nothing and reads no claim. Every instance reading every other's record at every
    look cost a group of N instances N² requests a look. A killed one is found by the one before it, and its shares
    move within three heartbeats of its last renewal."""
    import uuid

    from coordinator.conformance.faults import FaultProxyProcess
    from support.object_store import requests_between

    root = f"s3://lakehouse/{uuid.uuid4().hex}"
    direct = CoordinatorConfig(lakehouse=root, storage=s3_server.storage_options)
    init_lakehouse(Lakehouse.of(direct))
    feed = TopicFeed(direct)
    feed.deliver("ORDERS", [("k", b"x")])
    feed.close()
    grant(direct, "credits", ["ORDERS"], shares=8)
    clock = Clock()
    with FaultProxyProcess(s3_server.endpoint) as proxy:
        settings = direct.replace(storage=proxy.storage_options(s3_server.storage_options), consumer_heartbeat_ms=1000,
                                  consumer_poll_interval_ms=5, consumer_commit_interval_ms=1000)
        consumers = [TopicConsumer("credits", ["ORDERS"], RecordingListener(), settings, clock=clock) for _ in range(4)]
        killed = None
        for consumer in consumers:
            consumer.start()
        try:
            wait_split(clock, consumers, 8)
            for _ in range(4):  # two heartbeats: the message's progress saved, the handovers' listings done
                tick(clock, consumers)
            before, probes = proxy.counts(), sum(log.probes for c in consumers for log in c._logs.values())
            looks = 10  # five heartbeats, a look every half
            for _ in range(looks):
                tick(clock, consumers)
            spent = requests_between(before, proxy.counts())
            probes = sum(log.probes for c in consumers for log in c._logs.values()) - probes
            assert spent["LIST"] == 0, spent
            # The token and the successor's record, a look each, besides the tables' probes (a GET each); a few
            # more where a loaded machine made a renewal late (the claims read back). Was 3 records a look besides.
            assert spent["GET"] - probes <= 2.5 * looks * len(consumers), (spent, probes)
            assert spent["PUT"] <= 6 * len(consumers), spent  # a renewal a heartbeat (and one that lands late)

            killed = sorted(consumers, key=lambda c: c.instance_id)[1]  # watched by the first
            rest = [consumer for consumer in consumers if consumer is not killed]
            lost = set(killed.shares)
            killed._halt()  # kill -9 right after a renewal: nothing saved, nothing withdrawn
            tick(clock, rest, 3)  # its record stale after two heartbeats, found by the first at the next look
            assert lost <= {share for c in rest for share in c.shares}  # and by the others at the look after
            tick(clock, rest)  # the shares the live ones hand over among themselves, at the look after that
            assert [set(c.shares) for c in rest] == shares_split(rest, 8)
        finally:
            for consumer in consumers:
                if consumer is not killed:
                    consumer.close()


def test_closing_lets_the_call_under_way_finish_and_starts_none_handed_over_behind_it(settings, feed, clock):
    """Every due key's messages are handed to the workers at once; closing starts none of those not started yet,
    and the group's next instance delivers them, none lost, the finished one not again."""
    settings = settings.replace(consumer_threads=1)
    grant(settings, "credits", ["ORDERS"], shares=1)
    feed.deliver("ORDERS", [(f"key-{n}", f"m{n}".encode()) for n in range(50)])
    release = threading.Event()
    listener = RecordingListener(lambda m: release.wait(60) and ConsumeResult.SUCCESS)
    consumer = TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock).start()
    wait_until(lambda: calls(listener, b"m0"), 30, "the first call")
    wait_until(lambda: consumer_read(consumer, 50), 30, "all 50 read and handed over")
    closing = threading.Thread(target=consumer.close)
    closing.start()
    wait_until(lambda: consumer._stopping.is_set(), 30, "the consumer closing")
    release.set()
    closing.join(30)
    assert not closing.is_alive() and listener.bodies() == [b"m0"]
    again = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], again, settings, clock=clock):
        wait_until(handled_count(again, 49), 30, "the 49 not started")
    assert sorted(again.bodies()) == sorted(f"m{n}".encode() for n in range(1, 50))
