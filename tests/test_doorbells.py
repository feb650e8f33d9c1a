"""Doorbells (``coordinator.doorbells``): on object storage the checker probes a quiet group's logs only when it
rings, and misses nothing for it: the rule tested with a clock that moves only when told, then on the S3 server
with 1,000 quiet groups, whose probes the trigger no longer makes."""

from __future__ import annotations


from coordinator.checker.segment import grown_to
from coordinator.commit_logs import Layout
from coordinator.doorbells import LIST_EVERY_S, QUIET_AFTER_S, RECHECK_S, Doorbell, GroupWatch, doorbell_key, group_of_doorbell
from coordinator.exceptions import AccessDeniedError
from coordinator.lakehouse import Lakehouse, create_table
from coordinator.producer.commit_log import CommitLogWriter, half_records
from coordinator.producer.message import Message
from coordinator.storage import FileStore, Listing
from coordinator.tables import COMMIT_LOG
from support import Clock, wait_until


def test_a_doorbell_is_named_after_its_group_and_no_other_file_is_one():
    assert doorbell_key("order_group") == "groups/order_group.bell"
    assert group_of_doorbell("order_group.bell") == "order_group"
    assert group_of_doorbell(doorbell_key("a/b.c").removeprefix("groups/")) == "a/b.c"
    for name in ("order_group", ".bell", "a.b.bell", "a%2fb.bell", "order_group.bel", "order_group.bell.x"):
        assert group_of_doorbell(name) is None, name


def test_a_writer_rings_after_its_first_commit_and_after_each_quiet_spell_only(tmp_path):
    clock, files = Clock(), FileStore.at(str(tmp_path))
    bell = Doorbell(files, "g", clock=clock)
    tags = []

    def landed_after(seconds: float) -> bool:
        clock.now += seconds
        bell.landed()
        tags.append(files.listing("groups").files.get("g.bell"))
        return len(tags) == 1 and tags[0] is not None or len(tags) > 1 and tags[-1] != tags[-2]

    assert landed_after(0)  # the first commit
    assert not landed_after(QUIET_AFTER_S / 2)  # busy: commits this close together never ring
    assert not landed_after(1)
    assert landed_after(QUIET_AFTER_S / 2 + 0.01)  # after a quiet spell


def test_a_ring_the_storage_refuses_is_given_up_and_a_failed_one_retried(tmp_path):
    class Refusing:
        def __init__(self, error):
            self.error, self.puts = error, 0

        def put(self, key, data):
            self.puts += 1
            raise self.error

    for error, puts in ((AccessDeniedError("groups/g.bell: denied"), 1), (OSError("connection reset"), 3)):
        files, clock = Refusing(error), Clock()
        bell = Doorbell(files, "g", clock=clock)
        for _ in range(3):
            bell.landed()  # never raises: the commit has landed whatever the ring does
            clock.now += 0.1
        assert files.puts == puts


def test_a_quiet_group_sleeps_until_it_rings_or_its_recheck_is_due():
    clock = Clock()
    watch = GroupWatch(clock=clock)

    def round_(grown=(), bells=None):
        probed = watch.start_round(["busy", "quiet"], bells or {})
        clock.now += 0.5  # the probes take time
        watch.end_round({group: group in grown for group in probed})
        clock.now += 0.5
        return probed

    assert round_(grown=["busy", "quiet"]) == {"busy", "quiet"}  # first seen: probed
    while clock.now < 1_700_000_000.0 + QUIET_AFTER_S + 2:
        assert round_(grown=["busy"]) == {"busy", "quiet"}  # awake until a round long after its growth
    assert watch.asleep() == {"quiet"}
    assert round_(grown=["busy"]) == {"busy"}
    assert round_(grown=["busy"], bells={"quiet": '"1"'}) == {"busy", "quiet"}  # it rang: probed once
    assert round_(grown=["busy"], bells={"quiet": '"1"'}) == {"busy"}  # the same tag: asleep still
    assert round_(grown=["busy", "quiet"], bells={"quiet": '"2"'}) == {"busy", "quiet"}  # rang, and grew
    assert "quiet" not in watch.asleep() and round_(grown=["busy"], bells={"quiet": '"2"'}) == {"busy", "quiet"}

    while "quiet" not in watch.asleep():
        round_(grown=["busy"], bells={"quiet": '"2"'})
    slept = clock.now
    rechecks = []
    while clock.now < slept + 2.5 * RECHECK_S:
        if "quiet" in round_(grown=["busy"], bells={"quiet": '"2"'}):
            rechecks.append(clock.now - slept)
    assert len(rechecks) == 2 and 0.75 * RECHECK_S <= rechecks[0] <= 1.25 * RECHECK_S + 1  # probed anyway, rarely


def test_groups_are_listed_at_most_every_list_interval_whatever_the_polls():
    clock = Clock()
    watch = GroupWatch(clock=clock)
    listed_at, rounds_that_listed = [], []

    def list_groups() -> Listing:
        listed_at.append(clock.now)
        return Listing(["g"], {"g.bell": f'"{len(listed_at)}"'})

    for _ in range(30):  # Spark's polls of the source, 125 ms apart
        assert watch.listing(list_groups).files["g.bell"] == f'"{len(listed_at)}"'  # the last listing's
        rounds_that_listed.append(watch.listed)
        clock.now += 0.125
    start = listed_at[0]
    assert listed_at == [start + LIST_EVERY_S * n for n in range(8)] and rounds_that_listed.count(True) == 8


def test_a_group_never_sleeps_past_a_commit_it_did_not_ring_for():
    """The rule's reason: a writer that committed within half the quiet time did not ring, so the group must not
    fall asleep before a round that started after that commit landed; a slow trigger must not change that."""
    clock = Clock()
    watch = GroupWatch(clock=clock)
    watch.start_round(["g"], {})
    watch.end_round({"g": True})  # growth seen at t0
    clock.now += QUIET_AFTER_S - 1  # one long trigger: no round in between
    watch.start_round(["g"], {})
    clock.now += 30  # the probes of this round take long
    watch.end_round({"g": False})
    assert watch.asleep() == set()  # this round started within the quiet time: it proves nothing
    assert watch.start_round(["g"], {}) == {"g"}


def test_on_s3_a_trigger_probes_the_busy_groups_and_those_that_rang_not_every_quiet_one(s3_server):
    import uuid

    from coordinator.conformance.faults import FaultProxyProcess

    quiet_groups = [f"quiet-{index:02d}" for index in range(40)]
    direct = Lakehouse(f"s3://lakehouse/{uuid.uuid4().hex}", s3_server.storage_options)
    for group in ["busy", *quiet_groups]:
        create_table(COMMIT_LOG, direct.commit_log(group), direct.storage)
    clock = Clock()
    watch = GroupWatch(clock=clock)

    def append(group: str) -> None:
        with CommitLogWriter(direct, group) as writer:  # a writer of its own: its first commit rings
            writer.submit(half_records(group, uuid.uuid4().hex, [Message("T", b"x")])).result()

    with FaultProxyProcess(s3_server.endpoint) as proxy:
        through_proxy = Lakehouse(direct.root, proxy.storage_options(s3_server.storage_options))

        def trigger(starts: dict, seconds: float = 1.0) -> tuple[dict, int]:
            clock.now += seconds
            before = sum(proxy.counts()["by_kind"].values())
            ends = grown_to(through_proxy, starts, layout=Layout(), watch=watch)
            return ends, sum(proxy.counts()["by_kind"].values()) - before

        ends, first = trigger({})
        assert first > len(quiet_groups)  # every group is new: each is probed
        ends, _ = trigger(ends, seconds=QUIET_AFTER_S + 1)  # nothing grew since a round that long ago: asleep
        assert watch.asleep() == {"busy", *quiet_groups}
        # Spark's next polls, a trigger interval apart: no listing within LIST_EVERY_S of the last, no probe
        assert trigger(ends, seconds=0.1) == (ends, 0) and trigger(ends, seconds=LIST_EVERY_S - 0.2) == (ends, 0)
        assert trigger(ends, seconds=0.2)[1] == 2  # past it: the listing, and the operators' log's next version
        requests = []
        with CommitLogWriter(direct, "busy") as busy:  # rings after its first commit only: it stays busy
            for commit in range(4):
                bell = direct.files.listing("groups").files.get("busy.bell")
                busy.submit(half_records("busy", uuid.uuid4().hex, [Message("T", b"x")])).result()
                if commit == 0:  # the ring follows the commit's result, off the send path
                    wait_until(lambda: direct.files.listing("groups").files.get("busy.bell") != bell)
                grown, made = trigger(ends)
                assert grown["groups/busy/commit_log"] == ends["groups/busy/commit_log"] + 1  # found each time
                ends = grown
                requests.append(made)
        assert watch.asleep() == set(quiet_groups)
        assert max(requests) <= 6  # the listing and the busy group's probes, whatever the quiet groups

        append("quiet-07")  # a long-quiet group's next record: its writer's first commit rang
        grown, made = trigger(ends)
        assert grown["groups/quiet-07/commit_log"] == 2 and made <= 8
        assert {key for key in grown if grown[key] != ends[key]} == {"groups/quiet-07/commit_log"}
