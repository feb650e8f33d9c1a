"""What ``txcoord consumer-groups describe`` and the checker's consumer metrics say of a consumer group's lag, and
what saying it costs: counted from the group's progress records and the topic log's statistics (no message read),
right on a small topic, checked against the rows themselves; and on the S3 server a few requests whatever the
lag, counted through the fault proxy, which logs each request."""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid

import pytest

from coordinator import ConsumeResult, TopicConsumer
from coordinator.appender import DeltaAppender
from coordinator.config import CoordinatorConfig
from coordinator.consumer.group import ConsumerGroup, ShareProgress, share_of
from coordinator.consumer.topic_log import TopicLog
from coordinator.lakehouse import Lakehouse, init_lakehouse
from coordinator.lakehouse.checkpoints import last_delta_checkpoint
from coordinator.lakehouse.row_counts import RowCounts
from coordinator.ops.consumer_groups import describe_consumer_group, reset_consumer_group
from support.consumers import RecordingListener, TopicFeed, grant
from support.waiting import wait_until
from tests.test_consumer import consumer_settings

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture
def settings(tmp_path):
    # A failed message waits for a retry the test never lets come: it stays listed in its share's record.
    return consumer_settings(tmp_path).replace(consumer_retry_delays_ms=(3_600_000,), consumer_max_attempts=5)


def deliver_versions(feed: TopicFeed, versions: int, rnd: random.Random, poison: float = 0.0) -> None:
    """``versions`` versions of 1 to 29 messages, some keys repeating; a ``poison`` part of them without a key (a
    key's messages wait behind one of its own that failed)."""
    for _ in range(versions):
        feed.deliver("ORDERS", [(None, b"poison") if rnd.random() < poison else (f"k{rnd.randrange(40)}", b"ok")
                                for _ in range(rnd.randrange(1, 30))])


def checkpoint_every(config: CoordinatorConfig, versions: int) -> None:
    """The topic's Delta checkpoints every ``versions`` commits (from its next appender on)."""
    lakehouse = Lakehouse.of(config)
    appender = DeltaAppender(lakehouse.topic("ORDERS"), storage=lakehouse.storage or None)
    appender.set_properties({"delta.checkpointInterval": str(versions)})
    appender.close()


def lag_in_rows(config: CoordinatorConfig, group: str) -> int:
    """The group's lag on ORDERS as its messages say it: each share's messages listed as not handled, and those at
    or past its position (how describe counted it by reading every row)."""
    lakehouse = Lakehouse.of(config)
    records, log = ConsumerGroup(lakehouse, group), TopicLog(lakehouse.files, "topics/ORDERS")
    shares, latest = records.grant().shares, log.latest()
    lag = 0
    for number in range(shares):
        progress = records.progress("ORDERS", number)[0] or records.recorded_start("ORDERS") or ShareProgress(0)
        for version in range(progress.position, latest + 1):
            listed = set(progress.unhandled.get(version, ()))
            for row in log.share_rows(version, number, shares, share_of):
                offset = row["queue_offset"]
                unread = (version, offset) >= (progress.version, progress.offset) and offset >= progress.floor
                lag += offset in listed or unread
    return lag


def oldest_commit_ms(config: CoordinatorConfig, version: int) -> int:
    rows = TopicLog(Lakehouse.of(config).files, "topics/ORDERS").rows(version)
    return (min(row["commit_timestamp"] for row in rows) - EPOCH) // dt.timedelta(milliseconds=1)


def orders(config: CoordinatorConfig, group: str = "credits", now=None, row_counts=None):
    described = describe_consumer_group(config, group, now, row_counts)
    return next(topic for topic in described.topics if topic.topic == "ORDERS")


def test_row_counts_through_each_version_are_its_rows_from_any_known_count_before_or_after_it(settings):
    init_lakehouse(Lakehouse.of(settings))
    feed, rnd = TopicFeed(settings), random.Random(7)
    deliver_versions(feed, 1, rnd)
    checkpoint_every(settings, 5)  # version 1: no row
    deliver_versions(feed, 22, rnd)
    feed.close()
    files = Lakehouse.of(settings).files
    log = TopicLog(files, "topics/ORDERS")
    assert any(key.endswith(".checkpoint.parquet") for key in files.list("topics/ORDERS/_delta_log"))
    rows, through = 0, []
    for version in range(log.latest() + 1):
        rows += log.row_count(version)
        through.append(rows)
    counts = RowCounts(files, "topics/ORDERS")
    assert counts.latest() == len(through) - 1
    assert [counts.through(version) for version in range(len(through))] == through
    for version in (0, 3, 9, 16, 21):  # from a caller's count after the version, and before it
        assert RowCounts(files, "topics/ORDERS").through(version, {version + 2: through[version + 2]}) == through[version]
        assert RowCounts(files, "topics/ORDERS").through(version, {version - 1: through[version - 1]
                                                                   if version else 0}) == through[version]
    assert counts.before(len(through)) == through[-1] and counts.before(0) == 0


def test_describe_counts_the_lag_of_a_group_from_its_records_and_the_logs_statistics_as_its_messages_say_it(settings):
    """Never started, then after an instance read everything (a few messages failing, listed in their shares'
    records) and the topic grew; the same lag whether a share's record knows how many messages came before its
    position or describe counts them itself, and from a caller's kept counts."""
    init_lakehouse(Lakehouse.of(settings))
    grant(settings, "credits", ["ORDERS"], shares=4)
    feed, rnd = TopicFeed(settings), random.Random(3)
    deliver_versions(feed, 1, rnd)
    checkpoint_every(settings, 4)
    deliver_versions(feed, 9, rnd, poison=0.1)
    total = lag_in_rows(settings, "credits")
    now = dt.datetime.now(dt.timezone.utc)
    never_started = orders(settings, now=now)
    assert never_started.lag_messages == total and never_started.position == 0 and never_started.latest_version == 10
    assert never_started.lag_seconds == ((now - EPOCH) // dt.timedelta(milliseconds=1) - oldest_commit_ms(settings, 0)) / 1000

    listener = RecordingListener(lambda m: ConsumeResult.FAILURE if m.body == b"poison" else ConsumeResult.SUCCESS)
    with TopicConsumer("credits", ["ORDERS"], listener, settings):
        wait_until(lambda: len(listener.handled) >= total, 30, "every message called once")
    failed = [m for m in listener.handled if m.body == b"poison"]
    assert failed and orders(settings).lag_messages == len(failed) == lag_in_rows(settings, "credits")
    deliver_versions(feed, 7, rnd)
    feed.close()
    kept: dict = {}
    described = orders(settings, now=now, row_counts=kept)
    assert described.lag_messages == lag_in_rows(settings, "credits") > len(failed)
    assert described.retrying == len(failed)
    first_failed = min(m.topic_version for m in failed)
    assert described.position == first_failed
    assert described.lag_seconds == max(0, (now - EPOCH) // dt.timedelta(milliseconds=1)
                                        - oldest_commit_ms(settings, first_failed)) / 1000
    assert orders(settings, now=now, row_counts=kept) == described  # again, from the counts kept

    records = ConsumerGroup(Lakehouse.of(settings), "credits")
    for number in range(4):  # as a record that does not know the messages before its position says it
        progress, version = records.progress("ORDERS", number)
        progress.topic_rows_before = None
        records.save_progress("ORDERS", number, progress, version, "tester")
    assert orders(settings, now=now) == described


def test_a_group_started_at_latest_or_reset_counts_its_lag_from_where_it_started(settings):
    """The first instance records how many messages came before the group's start; a reset records it too."""
    init_lakehouse(Lakehouse.of(settings))
    grant(settings, "credits", ["ORDERS"], shares=4)
    feed, rnd = TopicFeed(settings), random.Random(5)
    deliver_versions(feed, 6, rnd)
    before = lag_in_rows(settings, "credits")
    listener = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], listener, settings.replace(consumer_start_from="latest")) as consumer:
        wait_until(lambda: len([s for s in consumer.shares if s[0] == "ORDERS"]) == 4, 30, "every share taken")
    start = ConsumerGroup(Lakehouse.of(settings), "credits").recorded_start("ORDERS")
    assert start.version == 6 and start.topic_rows_before == before and not listener.handled
    deliver_versions(feed, 3, rnd)
    assert orders(settings).lag_messages == lag_in_rows(settings, "credits") > 0

    reset_consumer_group(settings, "credits", "ORDERS", "latest", operator="tester")
    assert ConsumerGroup(Lakehouse.of(settings), "credits").progress("ORDERS", 2)[0].topic_rows_before \
        == sum(TopicLog(Lakehouse.of(settings).files, "topics/ORDERS").row_count(v) for v in range(9))
    assert orders(settings).lag_messages == 0
    deliver_versions(feed, 2, rnd)
    feed.close()
    assert orders(settings).lag_messages == lag_in_rows(settings, "credits") > 0


def requests_of(log_path: str, since: int) -> list[dict]:
    with open(log_path) as log:
        return [json.loads(line) for line in log][since:]


def test_on_object_storage_a_describe_costs_the_same_few_requests_whatever_the_lag(s3_server, tmp_path):
    """Through the proxy: a group that has read nothing of a topic ten versions long, then of the same topic a
    hundred times longer, costs about as many requests, none for a data file; a caller's kept counts then
    read no commit when nothing was committed since, and only the new ones when some were."""
    from coordinator.conformance.faults import FaultProxyProcess
    from support.object_store import requests_between

    root = f"s3://lakehouse/{uuid.uuid4().hex}"
    direct = CoordinatorConfig(lakehouse=root, storage=s3_server.storage_options)
    init_lakehouse(Lakehouse.of(direct))
    grant(direct, "credits", ["ORDERS"], shares=4)
    feed = TopicFeed(direct)
    feed.deliver("ORDERS", [("k", b"x")])
    checkpoint_every(direct, 10)
    for _ in range(9):
        feed.deliver("ORDERS", [("k", b"x")] * 2)
    files = Lakehouse.of(direct).files
    # Each measured at its newest version's checkpoint (written beside the appends): the same place in the interval.
    wait_until(lambda: last_delta_checkpoint(files, "topics/ORDERS") == 10, 30, "the checkpoint of version 10")
    request_log = str(tmp_path / "requests.jsonl")
    with FaultProxyProcess(s3_server.endpoint, request_log=request_log) as proxy:
        reader = direct.replace(storage=proxy.storage_options(s3_server.storage_options))

        def described(row_counts=None):
            """The lag, how many requests describe made (the proxy's count), and the requests logged meanwhile (the
            log is written as each request ends: the last may not be in it yet)."""
            since, before = len(requests_of(request_log, 0)), proxy.counts()
            lag = orders(reader, row_counts=row_counts).lag_messages
            return lag, requests_between(before, proxy.counts())["total"], requests_of(request_log, since)

        small, small_total, _ = described()
        for _ in range(10):
            feed.deliver("ORDERS", [(f"k{n}", b"x") for n in range(1000)])
        wait_until(lambda: last_delta_checkpoint(files, "topics/ORDERS") == 20, 30, "the checkpoint of version 20")
        large, large_total, large_requests = described()
        assert (small, large) == (19, 10_019)
        # A record a share; the grant, the group's start record, six listings (its progress, the log from its
        # checkpoint and from its start, the instances, the dead letters' and actions' tables), the checkpoint's
        # pointer and itself, the oldest version's commit: none more for a lag 500 times larger.
        assert small_total <= 4 + 11 and large_total <= small_total, large_requests
        read = [request["path"] for request in large_requests if request["kind"] == "GET"]
        assert not [path for path in read if path.endswith(".parquet") and ".checkpoint." not in path]

        kept: dict = {}
        described(kept)
        lag, _, again = described(kept)
        assert lag == large and not [r for r in again if r["kind"] == "GET" and r["path"].endswith(".json")
                                     and "/_delta_log/" in r["path"]]
        feed.deliver("ORDERS", [("k", b"x")] * 3)
        lag, _, grown = described(kept)
        commits = [r["path"] for r in grown if r["kind"] == "GET" and "/_delta_log/0" in r["path"]]
        assert lag == large + 3 and len(commits) == 1 and commits[0].endswith(f"{21:020d}.json")
    feed.close()
