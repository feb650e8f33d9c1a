"""A consumer group's membership changes (``_instances/_changes``): recorded by conditional writes so that
instances recording at once all land, read as untrusted bytes, and an instance that missed more than are kept
reads every record. On a local disk and on the S3 server."""

from __future__ import annotations

import threading

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.consumer.group import ConsumerGroup
from coordinator.consumer.instances import KEPT_CHANGES, membership_changes
from coordinator.consumer.membership import Membership
from coordinator.lakehouse import Lakehouse
from support.clock import Clock


@pytest.fixture(params=["local", "s3"])
def lakehouse(request, tmp_path):
    if request.param == "local":
        return Lakehouse(str(tmp_path / "lakehouse"))
    return request.getfixturevalue("s3_lakehouse")


def test_changes_recorded_at_once_all_land_in_order_and_the_last_ones_are_kept(lakehouse):
    instances = ConsumerGroup(lakehouse, "credits").instances
    barrier = threading.Barrier(4)

    def record(writer):
        barrier.wait()
        for n in range(6):
            instances.record_change("credits", "joined", f"{writer}-{n}")

    threads = [threading.Thread(target=record, args=(writer,)) for writer in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    changes = membership_changes(instances.changes("credits"))
    assert sorted(instance for _, _, instance in changes) == sorted(f"{w}-{n}" for w in "abcd" for n in range(6))
    for writer in "abcd":  # each writer's in the order it wrote them
        assert [i for _, _, i in changes if i.startswith(writer)] == [f"{writer}-{n}" for n in range(6)]

    for n in range(KEPT_CHANGES + 5):
        instances.record_change("credits", "left", f"x{n}")
    kept = membership_changes(instances.changes("credits"))
    assert [i for _, _, i in kept] == [f"x{n}" for n in range(5, KEPT_CHANGES + 5)]


@pytest.mark.parametrize("written", [b"not json", b'{"a": 1}', b'[["id", "crowned", "x"]]', b'[[1, 2, 3]]', b"[" * 5000])
def test_changes_that_are_not_changes_read_as_none_and_the_next_record_replaces_them(lakehouse, written):
    instances = ConsumerGroup(lakehouse, "credits").instances
    lakehouse.files.put("consumers/credits/_instances/_changes", written)
    assert membership_changes(instances.changes("credits")) == []
    instances.record_change("credits", "joined", "a")
    assert [(kind, i) for _, kind, i in membership_changes(instances.changes("credits"))] == [("joined", "a")]


def member(lakehouse, clock, instance_id):
    group = ConsumerGroup(lakehouse, "credits", clock=clock)
    membership = Membership(group, instance_id, CoordinatorConfig(lakehouse=lakehouse.root, consumer_heartbeat_ms=1000),
                            clock, remote=not lakehouse.is_local)
    membership.renew()
    membership.prove([])  # what the consumer's loop does first: it holds no share yet
    membership.join()
    return membership


def test_an_instance_applies_the_changes_since_its_last_look_and_reads_every_record_when_it_missed_more(lakehouse):
    clock = Clock()
    a, b = member(lakehouse, clock, "a"), member(lakehouse, clock, "b")
    assert a.survey() == {"a", "b"} and b.survey() == {"a", "b"}
    c = member(lakehouse, clock, "c")
    assert a.survey() == {"a", "b", "c"}  # c's joining applied: its record read
    c.withdraw()
    assert a.survey() == {"a", "b"}
    # More changes than are kept while b looked away: b reads every record.
    instances = ConsumerGroup(lakehouse, "credits").instances
    for n in range(KEPT_CHANGES + 1):
        instances.record_change("credits", "left", f"gone-{n}")
    instances.announce("credits", "d", heartbeat_s=1.0)
    assert b.survey() == {"a", "b", "d"}


def test_an_instance_found_dead_is_dropped_by_all_and_one_taken_for_dead_joins_again(lakehouse):
    clock = Clock()
    a, b, c = (member(lakehouse, clock, name) for name in "abc")
    for m in (a, b, c):
        m.survey()
    clock.now += 2.5  # b renews no more; a and c do
    a.renew()
    c.renew()
    assert a.survey() == {"a", "c"}  # a watches b, finds it dead and says so
    assert c.survey() == {"a", "c"}  # c applies that
    b.renew()  # back after a gap: it says so
    assert a.survey() == {"a", "b", "c"} and c.survey() == {"a", "b", "c"}
