"""Consumer groups through the ordinary events of production: an operator's resets, redrives and discards, a
message that keeps failing in a busy share, a record that is not one, a topic's maintenance while a group is
stopped, a close with a deadline, and the metrics an operator watches. Real Delta topics, the real consumer, on a
local disk and on the S3 server, a clock the test moves (support/clock.py); every message a listener was called
with must end handled, retrying, or an open or closed dead letter."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest

from coordinator import ConsumeResult, TopicConsumer
from coordinator.consumer.group import ConsumerGroup, ShareProgress, share_of
from coordinator.consumer import metrics as consumer_metrics
from coordinator.consumer.topic_log import TopicLog
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.ops.consumer_groups import (describe_consumer_group, discard_dead_letters, open_dead_letters,
                                             operator_actions, redrive_dead_letters, reset_consumer_group)
from coordinator.ops.consumer_groups import _close as close_dead_letters
from coordinator.ops.maintenance import maintain
from coordinator.exceptions import ConsumerStateError
from support.clock import Clock
from support.consumers import RecordingListener, TopicFeed, grant
from support.waiting import wait_until
from tests.test_consumer import consumer_settings, tick


@pytest.fixture(params=["local", "s3"])
def settings(request, tmp_path):
    local = consumer_settings(tmp_path).replace(consumer_retry_delays_ms=(1000,), consumer_max_attempts=2)
    if request.param == "local":
        return local
    lakehouse = request.getfixturevalue("s3_lakehouse")
    return local.replace(lakehouse=lakehouse.root, storage=lakehouse.storage)


@pytest.fixture
def feed(settings):
    feed = TopicFeed(settings)
    yield feed
    feed.close()


def poison_listener():
    return RecordingListener(lambda m: ConsumeResult.FAILURE if m.body.startswith(b"poison")
                             else ConsumeResult.SUCCESS)


def dead_letters_of(settings, group="credits"):
    lakehouse = Lakehouse.of(settings)
    if not lakehouse.exists(f"{lakehouse.consumer_dir(group)}/dead_letters"):
        return []
    return read_table(lakehouse.consumer_table(group, "dead_letters"), storage=lakehouse.storage).to_pylist()


def consume_until(settings, listener, clock, condition, what, group="credits"):
    """Run one instance of ``group`` until ``condition()``, moving the clock past each retry delay."""
    with TopicConsumer(group, ["ORDERS"], listener, settings, clock=clock) as consumer:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, f"{what}: not within 60 s"
            tick(clock, [consumer], 0.5)


def test_every_poison_message_ends_a_dead_letter_through_resets_each_way(settings, feed):
    """The user's report: after a reset to latest, later poison messages were neither handled nor dead letters
    (the dead letters' numbering restarted and their writes were taken for replays). Every delivery life of a
    message that fails out is now a dead letter of its own, through resets to latest, earliest and an offset."""
    clock = Clock()
    grant(settings, "credits", ["ORDERS"])
    first = feed.deliver("ORDERS", [(f"k{n}", b"poison-%d" % n) for n in range(10)])
    listener = poison_listener()
    consume_until(settings, listener, clock, lambda: len(dead_letters_of(settings)) >= 10, "ten dead letters")
    discard_dead_letters(settings, "credits", first[:3], operator="alice@ops")

    reset_consumer_group(settings, "credits", "ORDERS", "latest", operator="alice@ops")
    later = feed.deliver("ORDERS", [(f"k{n}", b"poison-late-%d" % n) for n in range(5)])
    consume_until(settings, listener, clock, lambda: len(dead_letters_of(settings)) >= 15, "five more")

    reset_consumer_group(settings, "credits", "ORDERS", "earliest", operator="alice@ops")
    consume_until(settings, listener, clock, lambda: len(dead_letters_of(settings)) >= 30, "all fifteen again")

    reset_consumer_group(settings, "credits", "ORDERS", "13", operator="alice@ops")  # a queue offset
    consume_until(settings, listener, clock, lambda: len(dead_letters_of(settings)) >= 32, "offsets 13 and 14")

    dead = dead_letters_of(settings)
    assert len({d["dead_letter_id"] for d in dead}) == len(dead) == 32
    by_message = {}
    for d in dead:
        by_message.setdefault(d["msg_id"], []).append(d["dead_letter_id"])
    assert all(len(by_message[m]) == 2 for m in first) and all(len(by_message[m]) in (2, 3) for m in later)
    # Each call ended in a dead letter: two attempts each, and nothing left between handled and dead.
    assert len(listener.handled) == 2 * len(dead)
    open_ids = {d["dead_letter_id"] for d in open_dead_letters(settings, "credits")}
    assert len(open_ids) == 32 - 3
    assert ConsumerGroup(Lakehouse.of(settings), "credits").start("ORDERS", lambda: 0).epoch == 3


def test_two_operators_redriving_at_once_redrive_each_dead_letter_once(settings, feed):
    clock = Clock()
    grant(settings, "credits", ["ORDERS"])
    feed.deliver("ORDERS", [(f"k{n}", b"poison-%d" % n) for n in range(6)])
    consume_until(settings, poison_listener(), clock, lambda: len(dead_letters_of(settings)) >= 6, "six dead letters")
    results, barrier = {}, threading.Barrier(3)

    def act(name, action):
        barrier.wait()
        results[name] = action(settings, "credits", operator=name)

    threads = [threading.Thread(target=act, args=("alice", redrive_dead_letters)),
               threading.Thread(target=act, args=("bob", redrive_dead_letters)),
               threading.Thread(target=act, args=("carol", discard_dead_letters))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    acted = [d["dead_letter_id"] for name in results for d in results[name]]
    assert sorted(acted) == sorted(d["dead_letter_id"] for d in dead_letters_of(settings))  # each once
    redriven = [d["msg_id"] for d in results["alice"] + results["bob"]]
    assert sorted(redrive_rows(settings)) == sorted(redriven)
    assert open_dead_letters(settings, "credits") == []


def redrive_rows(settings, group="credits"):
    lakehouse = Lakehouse.of(settings)
    if not lakehouse.exists(f"{lakehouse.consumer_dir(group)}/redrive"):
        return []
    return [row["msg_id"] for row in read_table(lakehouse.consumer_table(group, "redrive"),
                                                storage=lakehouse.storage).to_pylist()]


def test_a_redrive_interrupted_between_its_two_commits_is_completed_once_by_the_next(settings, feed):
    clock = Clock()
    grant(settings, "credits", ["ORDERS"])
    ids = feed.deliver("ORDERS", [("k1", b"poison-1"), ("k2", b"poison-2")])
    consume_until(settings, poison_listener(), clock, lambda: len(dead_letters_of(settings)) >= 2, "two dead letters")
    lakehouse = Lakehouse.of(settings)
    # The first half of a redrive, as a crash right after it leaves it: the dead letter closed, nothing appended.
    close_dead_letters(settings, lakehouse, "credits", "REDRIVE", [ids[0]], "alice@ops", "crashed")
    assert [d["msg_id"] for d in open_dead_letters(settings, "credits")] == [ids[1]]
    assert not lakehouse.exists(f"{lakehouse.consumer_dir('credits')}/redrive")
    discard_dead_letters(settings, "credits", [ids[1]], operator="bob@ops")  # the next command completes it
    redrive_dead_letters(settings, "credits", operator="bob@ops")  # nothing open: nothing more
    assert redrive_rows(settings) == [ids[0]]
    assert sorted(a["action"] for a in operator_actions(settings, "credits")) == ["DISCARD", "REDRIVE"]
    # The group consumes it again, attempts counted afresh, and it dies again as a new dead letter.
    consume_until(settings, poison_listener(), clock, lambda: len(dead_letters_of(settings)) >= 3, "redriven, dead again")
    again = [d for d in dead_letters_of(settings) if d["topic_version"] == -1]
    assert [(d["msg_id"], d["attempts"]) for d in again] == [(ids[0], 2)]
    assert again[0]["dead_letter_id"].startswith("~redrive.") and again[0]["dead_letter_id"].endswith(f".{ids[0]}.0")


def test_a_message_dead_twice_is_redriven_once_and_dies_again_as_one_new_dead_letter(settings, feed):
    """A reset delivered the message again and it died again: two open dead letters of one message. Redriving
    both delivers it once more (two rows of one queue offset in one redrive version would share a dead letter's
    id and a place in the share's progress, and one of them end neither handled nor dead)."""
    clock = Clock()
    grant(settings, "credits", ["ORDERS"])
    [msg_id] = feed.deliver("ORDERS", [("k1", b"poison-1")])
    listener = poison_listener()
    consume_until(settings, listener, clock, lambda: len(dead_letters_of(settings)) >= 1, "dead once")
    reset_consumer_group(settings, "credits", "ORDERS", "earliest", operator="alice@ops")
    consume_until(settings, listener, clock, lambda: len(dead_letters_of(settings)) >= 2, "dead twice")
    assert [d["msg_id"] for d in open_dead_letters(settings, "credits")] == [msg_id, msg_id]

    assert len(redrive_dead_letters(settings, "credits", operator="bob@ops")) == 2
    assert redrive_rows(settings) == [msg_id]
    consume_until(settings, listener, clock, lambda: len(dead_letters_of(settings)) >= 3, "redriven, dead again")
    [again] = open_dead_letters(settings, "credits")
    assert again["dead_letter_id"].startswith("~redrive.") and len(listener.handled) == 6  # two calls each life


def test_a_shares_record_stays_small_however_far_it_moves_past_a_message_that_keeps_failing(settings, feed):
    """The user's report: one poison message, then 200,000 others handled, grew the share's record to 2.6 MB;
    the next instance refused it and the share stopped. The record lists what is not handled, never what is."""
    settings = settings.replace(consumer_retry_delays_ms=(600_000,), consumer_max_attempts=16,
                                consumer_max_buffered=1000, consumer_commit_interval_ms=1)
    clock = Clock()
    grant(settings, "credits", ["ORDERS"], shares=1)
    poison = feed.deliver("ORDERS", [("stuck", b"poison")])[0]
    sizes = []
    group = ConsumerGroup(Lakehouse.of(settings), "credits")
    key = "consumers/credits/progress/ORDERS/0.json"
    listener = poison_listener()
    consumer = TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock).start()
    handled = 0

    def record_size() -> int:
        """The record's size once it lists nothing but the poison message (every other one handled and saved)."""
        def only_the_poison_listed():
            progress, _ = group.progress("ORDERS", 0)
            return progress is not None and progress.unhandled == {0: [0]}

        wait_until(lambda: only_the_poison_listed() or tick(clock, [consumer], 0.5), 60, "its progress saved")
        return len(group.files.read(key).data)

    for batch in range(10):
        feed.deliver("ORDERS", [(f"k{n % 97}", b"ok") for n in range(batch * 2000, (batch + 1) * 2000)])
        handled += 2000
        wait_until(lambda: len(listener.handled) >= handled + 1, 60, f"{handled} handled")
        sizes.append(record_size())
    consumer._halt()  # kill -9
    progress, _ = group.progress("ORDERS", 0)
    assert max(sizes) <= 64 * 1024, sizes
    assert sizes[-1] <= sizes[0] + 16  # not growing with what is handled (a digit or two of its position)
    assert [(v, o) for v, offsets in progress.unhandled.items() for o in offsets] == [(0, 0)]
    assert progress.retrying[0, 0]["attempts"] == 1
    # The next instance reads its own group's record and goes on.
    feed.deliver("ORDERS", [(f"n{n}", b"new") for n in range(200)])
    listener2 = poison_listener()
    with TopicConsumer("credits", ["ORDERS"], listener2, settings, clock=clock) as consumer2:
        tick(clock, [consumer2], 2.5)  # the killed instance's record goes stale: its share moves
        wait_until(lambda: len(listener2.handled) >= 200, 60, "the 200 new messages")
    assert poison not in {m.msg_id for m in listener2.handled}  # still waiting for its retry, not lost


def test_a_record_that_is_not_one_stops_its_share_alone_and_a_reset_moves_it_on(settings, feed):
    clock = Clock()
    grant(settings, "credits", ["ORDERS"], shares=2)
    group = ConsumerGroup(Lakehouse.of(settings), "credits")
    group.files.put("consumers/credits/progress/ORDERS/1.json", b'{"format": 2, "version": "lots"}')
    keys = {number: [k for k in (f"key-{n}" for n in range(100)) if share_of(k, "", 2) == number][:3]
            for number in (0, 1)}
    feed.deliver("ORDERS", [(k, k.encode()) for number in (0, 1) for k in keys[number]])
    listener = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock) as consumer:
        wait_until(lambda: len(listener.handled) >= 3, 30, "share 0's messages")
        health = consumer.health()
        assert not health.ok and list(health.stopped_shares) == ["ORDERS/1"]
        assert "txcoord consumer-groups reset credits --topic ORDERS" in health.stopped_shares["ORDERS/1"]
        tick(clock, [consumer], 1)
        assert sorted(m.keys for m in listener.handled) == sorted(keys[0])  # share 1 stopped, not looping
    reset_consumer_group(settings, "credits", "ORDERS", "earliest", operator="alice@ops")  # the way out
    again = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], again, settings, clock=clock) as consumer:
        wait_until(lambda: len(again.handled) >= 6, 30, "every message, share 1's too")
        assert consumer.health().ok


def compact_and_vacuum(settings, topic="ORDERS"):
    """Topic maintenance long after: its files compacted, the old ones vacuumed (a week's retention, run now)."""
    lakehouse = Lakehouse.of(settings)
    for _ in range(2):  # vacuum runs before compaction: the second run removes what the first compacted away
        results = maintain(lakehouse, tables=[f"topics/{topic}"], retention_hours=0, quiesced=True)
        assert not any(result.failed for result in results), results


def test_a_new_group_starting_earliest_on_a_compacted_and_vacuumed_topic_gets_every_message(settings, feed):
    grant(settings, "credits", ["ORDERS"])
    sent = [feed.deliver("ORDERS", [(f"k{n % 5}", b"%d-%d" % (version, n)) for n in range(20)])
            for version in range(6)]
    compact_and_vacuum(settings)
    listener = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], listener, settings, clock=Clock()):
        wait_until(lambda: len(listener.handled) >= 120, 30, "every message the topic holds")
    assert sorted(m.msg_id for m in listener.handled) == sorted(i for ids in sent for i in ids)
    for key in {m.keys for m in listener.handled}:  # a key's messages in order
        offsets = [m.queue_offset for m in listener.handled if m.keys == key]
        assert offsets == sorted(offsets)


@pytest.mark.parametrize("policy", ["earliest", "latest", "fail"])
def test_a_stopped_group_whose_position_maintenance_removed_follows_its_policy(settings, feed, policy):
    settings = settings.replace(consumer_position_gone=policy)
    grant(settings, "credits", ["ORDERS"], shares=1)
    before = feed.deliver("ORDERS", [(f"k{n}", b"before") for n in range(10)])
    listener = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], listener, settings, clock=Clock()):
        wait_until(lambda: len(listener.handled) >= 10, 30, "the first version")
    missed = [i for version in range(3) for i in feed.deliver("ORDERS", [(f"k{n}", b"missed") for n in range(10)])]
    compact_and_vacuum(settings)
    after = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], after, settings, clock=Clock()) as consumer:
        if policy == "earliest":  # what the topic still holds from the batch it had reached: none lost
            wait_until(lambda: len(after.handled) >= 30, 30, "the messages it missed, from the snapshot")
            assert sorted(m.msg_id for m in after.handled) == sorted(missed)
        elif policy == "fail":
            wait_until(lambda: consumer.health().stopped_shares, 30, "the share stopped")
            assert "PositionGoneError" in consumer.health().stopped_shares["ORDERS/0"]
        else:  # past every message there is when it finds its position gone, then on
            group = ConsumerGroup(Lakehouse.of(settings), "credits")
            past = TopicLog(group.files, "topics/ORDERS").latest() + 1
            wait_until(lambda: (group.progress("ORDERS", 0)[0] or ShareProgress(0)).version == past, 30, "moved on")
            new = feed.deliver("ORDERS", [("k", b"new")])
            wait_until(lambda: after.handled, 30, "what came after")
            assert [m.msg_id for m in after.handled] == new
    assert not set(before) & {m.msg_id for m in after.handled}
    gone = ConsumerGroup(Lakehouse.of(settings), "credits").progress("ORDERS", 0)[0].gone
    assert (gone["version"], gone["policy"]) == (1, policy)  # what describe shows
    if policy == "earliest":  # the snapshot's messages counted as read: the lag is what came after
        assert ConsumerGroup(Lakehouse.of(settings), "credits").progress("ORDERS", 0)[0].topic_rows_before == 40
        feed.deliver("ORDERS", [("k", b"later")] * 3)
        assert describe_consumer_group(settings, "credits").topics[0].lag_messages == 3


def test_close_with_a_timeout_returns_in_time_and_the_call_still_running_is_delivered_again(settings, feed):
    grant(settings, "credits", ["ORDERS"], shares=1)
    release = threading.Event()
    feed.deliver("ORDERS", [("k", b"slow"), ("k", b"next")])
    listener = RecordingListener(lambda m: release.wait(30) and ConsumeResult.SUCCESS if m.body == b"slow"
                                 else ConsumeResult.SUCCESS)
    consumer = TopicConsumer("credits", ["ORDERS"], listener, settings, clock=Clock()).start()
    try:
        wait_until(lambda: listener.handled, 30, "the slow call under way")
        started = time.monotonic()
        consumer.close(timeout=1.0)
        assert time.monotonic() - started < 5
    finally:
        release.set()
    again = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], again, settings, clock=Clock()):
        wait_until(lambda: len(again.handled) >= 2, 30, "both, from the first")
    assert again.bodies() == [b"slow", b"next"]


def test_an_error_of_the_consumers_own_stops_it_and_close_says_why(settings, feed, monkeypatch):
    grant(settings, "credits", ["ORDERS"])
    consumer = TopicConsumer("credits", ["ORDERS"], RecordingListener(), settings, clock=Clock()).start()

    def broken(shares):  # a bug in the consumer's own code, as the loop runs it
        raise RuntimeError("a bug")

    monkeypatch.setattr(consumer._reading, "read", broken)
    wait_until(lambda: consumer.health().state == "stopped", 30, "the consumer stopped")
    assert consumer.failure is not None and "a bug" in consumer.health().failure
    with pytest.raises(ConsumerStateError, match="a bug"):
        consumer.close()


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def metric(text, name, **labels):
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_consumer_serves_its_calls_shares_and_lag_to_prometheus(settings, feed):
    settings = settings.replace(consumer_metrics_port=0, metrics_host="127.0.0.1")
    clock = Clock()
    grant(settings, "credits", ["ORDERS"])
    feed.deliver("ORDERS", [(f"k{n}", b"ok") for n in range(8)] + [("bad", b"poison")])
    listener = poison_listener()
    served = consumer_metrics._served.get((settings.metrics_host, 0))
    before = scrape(served.port) if served is not None else ""
    with TopicConsumer("credits", ["ORDERS"], listener, settings, clock=clock) as consumer:
        wait_until(lambda: len(dead_letters_of(settings)) >= 1 or tick(clock, [consumer], 0.5), 60, "the dead letter")
        port = consumer._metrics.port
        text = scrape(port)

        def counted(name, **labels):  # this test's part: the process's counters also hold earlier tests' calls
            return metric(text, name, **labels) - (metric(before, name, **labels) or 0)

        assert counted("txcoord_consumer_calls_total", group="credits", topic="ORDERS", outcome="handled") == 8
        assert counted("txcoord_consumer_calls_total", group="credits", topic="ORDERS", outcome="failed") == 2
        assert counted("txcoord_consumer_retries_total", group="credits", topic="ORDERS") == 1
        assert counted("txcoord_consumer_dead_lettered_total", group="credits", topic="ORDERS") == 1
        assert counted("txcoord_consumer_handling_seconds_count", group="credits", topic="ORDERS") == 8
        assert metric(text, "txcoord_consumer_shares_held", group="credits", instance=consumer.instance_id) == 8
        assert metric(text, "txcoord_consumer_instance_lag_messages", group="credits",
                      instance=consumer.instance_id, topic="ORDERS") == 0
        assert metric(text, "txcoord_consumer_fenced", group="credits", instance=consumer.instance_id) == 0
        assert metric(text, "txcoord_consumer_read_rows_total", group="credits", instance=consumer.instance_id,
                      topic="ORDERS") == 9  # the one version, whole (a small one is not cut by slot)
        assert metric(text, "txcoord_consumer_read_bytes_total", group="credits", instance=consumer.instance_id,
                      topic="ORDERS") == consumer.read_totals()["ORDERS"][0] > 0
    assert describe_consumer_group(settings, "credits").open_dead_letters == 1


def test_a_first_format_record_is_read_and_written_back_in_the_new_form(settings, feed):
    """A group upgraded from a version that listed what it had handled past its watermark goes on from there."""
    grant(settings, "credits", ["ORDERS"], shares=1)
    ids = feed.deliver("ORDERS", [("k", b"a"), ("k", b"b"), ("k", b"c")])
    group = ConsumerGroup(Lakehouse.of(settings), "credits")
    group.files.put("consumers/credits/progress/ORDERS/0.json",
                    b'{"version": 0, "floor": 0, "done": {"0": [0]}, "dead_letters": 0, '
                    b'"retrying": {"1": {"attempts": 1, "due_ms": 0, "error": "x", "dead": false}}}')
    listener = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], listener, settings, clock=Clock()):
        wait_until(lambda: len(listener.handled) >= 2, 30, "b and c")
    assert [(m.msg_id, m.delivery_attempt) for m in listener.handled] == [(ids[1], 2), (ids[2], 1)]
    progress, _ = group.progress("ORDERS", 0)
    assert (progress.version, progress.unhandled, progress.skip) == (1, {}, {})
    assert ShareProgress.parse(group.files.read("consumers/credits/progress/ORDERS/0.json").data).retrying == {}
