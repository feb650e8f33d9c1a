"""A topic's files by slot (coordinator.lakehouse.slots): every reader still sees every row, and a consumer instance
reads its shares' rows from a part of each file (bytes and rows counted by its TopicLog)."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from coordinator.consumer.group import share_of
from coordinator.consumer.topic_log import TopicLog
from coordinator.lakehouse import Lakehouse, init_lakehouse
from coordinator.lakehouse.deltalog import commit_actions
from coordinator.lakehouse.slots import SLOTS_TAG, SlotIndex, read_row_groups, write_by_slot
from coordinator.storage import FileStore
from coordinator.tables import TOPIC
from coordinator import CoordinatorConfig
from support.consumers import TopicFeed

BODY = 1024


def messages(count: int, seed: int = 7) -> list[tuple]:
    chance = random.Random(seed)
    return [(None if index % 5 == 0 else f"order-{chance.randrange(10 ** 6)}", chance.randbytes(BODY))
            for index in range(count)]


def topic_rows(count: int, seed: int = 7) -> pa.Table:
    chance = random.Random(seed)
    rows = [{"msg_id": f"{chance.getrandbits(128):032x}", "keys": keys, "body": body, "queue_offset": offset}
            for offset, (keys, body) in enumerate(messages(count, seed))]
    return pa.Table.from_pylist(rows)


def test_a_file_by_slot_holds_every_row_and_each_share_lies_in_the_row_groups_its_index_names():
    data = topic_rows(3000)
    content, tags = write_by_slot(data)
    whole = pq.ParquetFile(pa.BufferReader(content)).read()
    assert sorted(whole.column("queue_offset").to_pylist()) == list(range(3000))
    index = SlotIndex.parse(tags[SLOTS_TAG], len(content))
    assert index is not None and index.bits >= 4
    for shares in (2, 4, 16, 128):
        for number in (0, 1, shares - 1):
            groups = index.row_groups_for({number}, shares)
            ranges = index.ranges_for(groups)
            part = read_row_groups(len(content), {span: content[span[0]:span[1]] for span in ranges}, groups)
            expected = {row["msg_id"] for row in data.to_pylist() if share_of(row["keys"], row["msg_id"], shares) == number}
            got = set(part.column("msg_id").to_pylist())
            assert expected <= got
            if shares <= 1 << index.bits:
                assert got == expected  # a share of no more shares than slots is whole slots: nothing else read
            assert len(ranges) == 2  # one share's slots lie side by side, then the footer


def test_every_share_is_every_row_group_when_the_count_is_not_a_power_of_two_or_one_instance_holds_all():
    content, tags = write_by_slot(topic_rows(1000))
    index = SlotIndex.parse(tags[SLOTS_TAG], len(content))
    assert index.row_groups_for({1}, 12) is None
    assert index.row_groups_for(set(range(16)), 16) is None


def test_a_small_version_is_one_plain_file_without_an_index():
    content, tags = write_by_slot(topic_rows(20))
    assert tags == {}
    assert pq.ParquetFile(pa.BufferReader(content)).metadata.num_row_groups == 1


@pytest.mark.parametrize("tag", [None, 7, "not json", "[]", '{"bits": 9, "footer": 100, "rowGroups": []}',
                                 '{"bits": 2, "footer": 10, "rowGroups": [[0, 4, 50]]}',
                                 '{"bits": 2, "footer": 100, "rowGroups": [[4, 4, 50]]}',
                                 '{"bits": 2, "footer": 100, "rowGroups": [["a", 4, 50]]}',
                                 '{"bits": true, "footer": 100, "rowGroups": []}'])
def test_an_index_that_does_not_hold_is_no_index(tag):
    assert SlotIndex.parse(tag, 1000) is None


@pytest.fixture
def lakehouse(tmp_path):
    settings = CoordinatorConfig(lakehouse=str(tmp_path / "lakehouse"))
    init_lakehouse(settings.lakehouse)
    feed = TopicFeed(settings)
    feed.deliver("ORDERS", messages(10))  # the table's first version, made by delta-rs
    for seed in range(3):
        feed.deliver("ORDERS", messages(1600, seed))
    feed.close()
    return Lakehouse(settings.lakehouse)


def test_spark_and_delta_rs_readers_see_every_row_of_a_topic_written_by_slot(lakehouse):
    table = DeltaTable(lakehouse.topic("ORDERS")).to_pyarrow_table()
    assert table.num_rows == 4810
    assert table.schema.names == TOPIC.column_names
    commit = FileStore.at(lakehouse.topic("ORDERS")).read("_delta_log/00000000000000000003.json")
    [add] = [action["add"] for action in commit_actions(commit.data) if "add" in action]
    assert json.loads(add["stats"])["numRecords"] == 1600
    assert SlotIndex.parse(add["tags"][SLOTS_TAG], add["size"]).bits >= 4


def share_of_rows(rows, number, shares):
    return [row for row in rows if share_of(row["keys"], row["msg_id"], shares) == number]


def test_each_instance_of_sixteen_reads_its_share_of_each_file_and_little_more(lakehouse):
    whole = TopicLog(lakehouse.files, "topics/ORDERS")
    rows = [row for version in (1, 2, 3) for row in whole.rows(version)]
    for number in range(16):
        part = TopicLog(lakehouse.files, "topics/ORDERS")
        part.want({number}, 16)
        for version in (1, 2, 3):
            assert part.share_rows(version, number, 16, share_of) == share_of_rows(whole.rows(version), number, 16)
            assert part.row_count(version) == whole.row_count(version) == 1600
            assert part.batch_of(version) == whole.batch_of(version)
        share = len(share_of_rows(rows, number, 16)) / len(rows)  # about a sixteenth, by chance
        assert part.rows_read == len(share_of_rows(rows, number, 16))
        # its row groups and the footer, which costs less than a quarter of a share
        assert part.bytes_read <= (share + 0.25 / 16) * whole.bytes_read


def test_a_share_asked_for_later_reads_the_version_again_with_it(lakehouse):
    whole = TopicLog(lakehouse.files, "topics/ORDERS")
    log = TopicLog(lakehouse.files, "topics/ORDERS")
    log.want({5}, 16)
    log.share_rows(2, 5, 16, share_of)
    read = log.bytes_read
    assert log.share_rows(2, 9, 16, share_of) == share_of_rows(whole.rows(2), 9, 16)
    assert log.bytes_read > read
    read = log.bytes_read
    assert log.share_rows(2, 5, 16, share_of) == share_of_rows(whole.rows(2), 5, 16)
    assert log.bytes_read == read  # kept: the two read together
    assert log.rows(2) == whole.rows(2)


def test_a_topic_by_slot_past_its_checkpoint_reads_the_same_in_spark_and_delta_rs_and_takes_sparks_appends(spark, tmp_path):
    settings = CoordinatorConfig(lakehouse=str(tmp_path / "lakehouse"))
    init_lakehouse(settings.lakehouse)
    feed = TopicFeed(settings)
    for seed in range(22):  # the topic checkpoints every 20 commits: versions 20 and 21 past it
        feed.deliver("ORDERS", messages(200, seed))
    feed.close()
    path = Lakehouse(settings.lakehouse).topic("ORDERS")
    assert FileStore.at(path).exists("_delta_log/00000000000000000020.checkpoint.parquet")
    seen_by_spark = spark.read.format("delta").load(path)
    assert seen_by_spark.count() == DeltaTable(path).to_pyarrow_table().num_rows == 22 * 200
    assert seen_by_spark.filter("queue_offset >= 4000").count() == 400
    more = seen_by_spark.limit(1).collect()[0].asDict()
    spark.createDataFrame([more], seen_by_spark.schema).write.format("delta").mode("append").save(path)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 22 * 200 + 1
    log = TopicLog(FileStore.at(settings.lakehouse), "topics/ORDERS")
    log.want({0}, 2)
    assert len(log.share_rows(21, 0, 2, share_of)) + len(log.share_rows(21, 1, 2, share_of)) == 200
    assert log.rows(22)[0]["msg_id"] == more["msg_id"]  # Spark's file: no slots, read whole
