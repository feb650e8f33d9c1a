"""One active checker per lakehouse: the lease refuses a second holder, or keeps it standing by,
and lapses when its holder releases it, stops renewing it, or is gone from this host."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from support import Clock, wait_until
from coordinator.control.lease import CheckerLease, standby_checkers
from coordinator.control.processes import process_gone
from coordinator.exceptions import CheckerAlreadyRunningError, LeaseLostError

# A checker's lease (of TTL argv[2]) in a child process: it says "held", then sleeps until killed.
HOLD = ("import sys, time; from coordinator.control.lease import CheckerLease; "
        "CheckerLease(sys.argv[1], ttl_s=float(sys.argv[2])).acquire(); print('held', flush=True); time.sleep(120)")


@pytest.fixture
def standby_logs(caplog):
    """The log records in which a waiting checker names the holder it stands by for."""
    caplog.set_level(logging.INFO, logger="coordinator.checker")
    return lambda: [r for r in caplog.records if "standing by" in r.getMessage()]


def in_thread(function) -> tuple[threading.Event, list]:
    """Run ``function`` in a thread; the event is set once it returned or raised, the list holds the outcome."""
    done, outcome = threading.Event(), []

    def run():
        try:
            outcome.append(function())
        except Exception as error:
            outcome.append(error)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, outcome


def on_disk(lease: CheckerLease) -> dict:
    """The lease file's record, as another process would read it."""
    with open(lease.path) as file:
        return json.load(file)


def held_by_a_child(tmp_path, ttl_s: float = 30) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), str(ttl_s)], stdout=subprocess.PIPE, text=True)
    done, outcome = in_thread(child.stdout.readline)
    if not done.wait(30):
        child.kill()
        pytest.fail("the child never took the lease")
    assert outcome == ["held\n"]
    return child


def test_second_checker_is_refused_while_the_first_renews(tmp_path):
    clock = Clock()
    first = CheckerLease(str(tmp_path), ttl_s=1.0, clock=clock).acquire()
    acquired = on_disk(first)
    assert (acquired["owner"], acquired["renewed_at"], acquired["ttl_s"]) == (first.owner, clock.now, 1.0)
    assert (acquired["host"], acquired["pid"]) == (socket.gethostname(), os.getpid())
    assert not acquired.get("released")
    with pytest.raises(CheckerAlreadyRunningError, match=rf"pid {os.getpid()}"):
        CheckerLease(str(tmp_path), ttl_s=1.0, clock=clock).acquire()
    assert on_disk(first) == acquired  # a refused checker writes nothing
    clock.now += 0.6
    first.renew()
    assert on_disk(first) == acquired | {"renewed_at": clock.now}
    clock.now += 0.6  # 1.2 s after acquiring, but renewed 0.6 s ago
    with pytest.raises(CheckerAlreadyRunningError):
        CheckerLease(str(tmp_path), ttl_s=1.0, clock=clock).acquire()
    clock.now += 0.5  # 1.1 s without renewal: lapsed
    second = CheckerLease(str(tmp_path), ttl_s=1.0, clock=clock).acquire()
    assert (on_disk(second)["owner"], on_disk(second)["renewed_at"]) == (second.owner, clock.now)


def test_is_free_says_whether_a_live_checker_holds_the_lease_and_takes_nothing(tmp_path):
    clock = Clock()
    looker = CheckerLease(str(tmp_path), ttl_s=1.0, clock=clock)
    assert looker.is_free()  # no checker ever ran here
    holder = CheckerLease(str(tmp_path), ttl_s=1.0, clock=clock).acquire()
    held = on_disk(holder)
    assert not looker.is_free()
    assert on_disk(holder) == held  # looking wrote nothing
    clock.now += 1.1  # not renewed within its TTL: lapsed
    assert looker.is_free()
    clock.now -= 1.1
    holder.release()
    assert looker.is_free()
    assert on_disk(holder)["owner"] == holder.owner  # still nobody else's: looking takes nothing


def test_a_dead_holder_is_taken_over_and_then_must_stop(tmp_path):
    clock = Clock()
    dead = CheckerLease(str(tmp_path), ttl_s=0.3, clock=clock).acquire()
    clock.now += 0.5  # no renewal: the holder is gone
    successor = CheckerLease(str(tmp_path), ttl_s=0.3, clock=clock).acquire()
    taken_over = on_disk(successor)
    assert (taken_over["owner"], taken_over["renewed_at"]) == (successor.owner, clock.now)
    with pytest.raises(LeaseLostError):
        dead.renew()
    assert on_disk(successor) == taken_over  # the refused renewal wrote nothing
    clock.now += 0.2
    successor.renew()
    renewed = on_disk(successor)
    assert (renewed["owner"], renewed["renewed_at"]) == (successor.owner, clock.now)
    dead.release()  # not its lease any more: must leave the successor's alone
    assert on_disk(successor) == renewed


@pytest.mark.parametrize("reaped", [True, False], ids=["gone", "zombie"])
def test_a_killed_holder_on_this_host_is_taken_over_at_once(tmp_path, reaped):
    child = held_by_a_child(tmp_path, ttl_s=3600)
    try:
        with pytest.raises(CheckerAlreadyRunningError):
            CheckerLease(str(tmp_path), ttl_s=30).acquire()  # alive: refused
        os.kill(child.pid, signal.SIGKILL)
        if reaped:
            child.wait(10)
        else:  # not reaped yet: a zombie, as when the parent of a killed checker has not waited for it
            wait_until(lambda: open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", 60)
        successor = CheckerLease(str(tmp_path), ttl_s=30).acquire()  # its hour-long lease was renewed a moment ago
    finally:
        child.kill()
        child.wait(10)
    assert (on_disk(successor)["owner"], on_disk(successor)["pid"]) == (successor.owner, os.getpid())
    successor.renew()


def test_a_reused_pid_does_not_pass_for_the_holder(tmp_path):
    holder = CheckerLease(str(tmp_path), ttl_s=30).acquire()
    record = json.loads(open(holder.path).read())
    assert not process_gone(record)  # this process, as it recorded itself
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        # The same pid with another start time: the holder died and its pid went to `other`.
        reused = record | {"pid": other.pid, "started": str(int(record["started"]) - 1)}
        with open(holder.path, "w") as file:
            json.dump(reused, file)
        assert process_gone(reused)
        successor = CheckerLease(str(tmp_path), ttl_s=30).acquire()
        taken = on_disk(successor)
        assert (taken["owner"], taken["pid"], taken["started"]) == (successor.owner, os.getpid(), record["started"])
    finally:
        other.kill()
        other.wait(10)


def test_a_holder_on_another_host_is_awaited_for_its_whole_lease(tmp_path):
    holder = CheckerLease(str(tmp_path), ttl_s=30).acquire()
    record = json.loads(open(holder.path).read()) | {"host": "elsewhere", "pid": 2 ** 22 + 1}  # no such pid here
    with open(holder.path, "w") as file:
        json.dump(record, file)
    assert not process_gone(record)
    with pytest.raises(CheckerAlreadyRunningError, match="host elsewhere"):
        CheckerLease(str(tmp_path), ttl_s=30).acquire()
    assert on_disk(holder) == record


def test_a_standby_waits_while_the_holder_renews_and_takes_over_once_it_stops(tmp_path, standby_logs):
    clock = Clock()
    holder = CheckerLease(str(tmp_path), ttl_s=0.5, clock=clock).acquire()
    standby = CheckerLease(str(tmp_path), ttl_s=0.5, clock=clock)  # polls every 0.05 s
    taken, outcome = in_thread(lambda: standby.acquire(wait=True))
    wait_until(standby_logs, 60)
    wait_until(lambda: standby_checkers(str(tmp_path), clock), 60)  # announced for operators to see
    assert [(c["owner"], c["pid"]) for c in standby_checkers(str(tmp_path), clock)] == [(standby.owner, os.getpid())]
    clock.now += 0.25
    holder.renew()
    clock.now += 0.25  # the lease's whole life since it was taken, but renewed 0.25 s ago
    assert not taken.wait(0.3), outcome  # some six polls
    assert on_disk(holder)["owner"] == holder.owner
    clock.now += 0.25  # 0.5 s without renewal: lapsed
    assert taken.wait(60) and outcome == [standby]
    assert (on_disk(standby)["owner"], on_disk(standby)["renewed_at"]) == (standby.owner, clock.now)
    with pytest.raises(LeaseLostError):
        holder.renew()
    assert len(standby_logs()) == 1, standby_logs()
    assert f"pid {os.getpid()}" in standby_logs()[0].getMessage()
    assert standby_checkers(str(tmp_path), clock) == [] and os.listdir(tmp_path / "system" / "_checker_standbys") == []


def test_a_standby_that_stops_announcing_itself_is_no_longer_shown(tmp_path):
    clock = Clock()
    CheckerLease(str(tmp_path), ttl_s=30, clock=clock).acquire()
    stop = threading.Event()
    standby = CheckerLease(str(tmp_path), ttl_s=1, clock=clock)
    done, outcome = in_thread(lambda: standby.acquire(wait=True, stop=stop))
    wait_until(lambda: standby_checkers(str(tmp_path), clock), 60)
    announcement = tmp_path / "system" / "_checker_standbys" / f"{standby.owner}.json"
    assert json.loads(announcement.read_text())["renewed_at"] == clock.now
    assert standby_checkers(str(tmp_path), lambda: clock.now + 1.0) == []  # seen its TTL later, had it hung
    stop.set()
    assert done.wait(60) and isinstance(outcome[0], CheckerAlreadyRunningError)
    assert not announcement.exists()  # a standby that gives up takes its announcement with it


def test_a_released_lease_is_taken_over_at_once(tmp_path, standby_logs):
    clock = Clock()  # never moves: the lease cannot run out
    holder = CheckerLease(str(tmp_path), ttl_s=1, clock=clock).acquire()
    standby = CheckerLease(str(tmp_path), ttl_s=1, clock=clock)  # polls every 0.1 s
    taken, outcome = in_thread(lambda: standby.acquire(wait=True))
    wait_until(standby_logs, 60)
    holder.release()
    assert taken.wait(60) and outcome == [standby]
    assert on_disk(standby)["owner"] == standby.owner and not on_disk(standby).get("released")
    assert len(standby_logs()) == 1


def test_a_waiting_killed_holder_is_taken_over_at_once(tmp_path, standby_logs):
    child = held_by_a_child(tmp_path, ttl_s=3600)
    standby = CheckerLease(str(tmp_path), ttl_s=2)  # polls every 0.2 s
    taken, outcome = in_thread(lambda: standby.acquire(wait=True))
    try:
        wait_until(standby_logs, 60)
        assert f"pid {child.pid}" in standby_logs()[0].getMessage()
        child.kill()
        child.wait(10)
        assert taken.wait(60) and outcome == [standby]  # not the hour the child's lease had left
    finally:
        child.kill()
        child.wait(10)
    assert (on_disk(standby)["owner"], on_disk(standby)["pid"]) == (standby.owner, os.getpid())


def test_a_standby_prepares_once_announced(tmp_path, standby_logs):
    clock = Clock()
    holder = CheckerLease(str(tmp_path), ttl_s=1, clock=clock).acquire()
    standby = CheckerLease(str(tmp_path), ttl_s=1, clock=clock)  # polls every 0.1 s
    seen_while_preparing = []

    def prepare():
        seen_while_preparing.append(([c["owner"] for c in standby_checkers(str(tmp_path), clock)], len(standby_logs())))
        holder.release()

    assert standby.acquire(wait=True, prepare=prepare) is standby
    assert seen_while_preparing == [([standby.owner], 1)]  # once, standing by and announced
    assert on_disk(standby)["owner"] == standby.owner


def test_a_free_lease_is_taken_without_preparing(tmp_path):
    prepared = []
    CheckerLease(str(tmp_path), ttl_s=30).acquire(wait=True, prepare=lambda: prepared.append(1))
    assert prepared == []


def test_stop_ends_the_wait_promptly(tmp_path):
    holder = CheckerLease(str(tmp_path), ttl_s=3600).acquire()  # lapses in no test: only the stop ends the wait
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(CheckerAlreadyRunningError, match="stopped while standing by"):
        CheckerLease(str(tmp_path), ttl_s=3600).acquire(wait=True, stop=stop)  # polls every second
    assert time.monotonic() - started < 30  # at the stop, not at the lease's lapse an hour later
    assert on_disk(holder)["owner"] == holder.owner


def test_release_lets_the_next_checker_start_at_once(tmp_path):
    clock = Clock()  # never moves: the 30 s lease cannot run out
    first = CheckerLease(str(tmp_path), clock=clock).acquire()
    held = on_disk(first)
    first.release()
    assert on_disk(first) == held | {"released": True}
    second = CheckerLease(str(tmp_path), clock=clock).acquire()
    assert on_disk(second) == held | {"owner": second.owner}  # this process again, not released


def test_an_unreadable_lease_file_is_replaced(tmp_path):
    lease = CheckerLease(str(tmp_path))
    (tmp_path / "system").mkdir()
    open(lease.path, "w").write("{half-written")
    lease.acquire()
    assert on_disk(lease)["owner"] == lease.owner
    lease.renew()


def test_hold_renews_only_when_the_last_renewal_leaves_less_than_asked_and_fails_once_taken_over(tmp_path):
    clock = Clock()
    holder = CheckerLease(str(tmp_path), ttl_s=3.0, clock=clock).acquire()
    taken = on_disk(holder)
    clock.now += 0.9
    holder.hold(2.0)  # 2.1 s of the lease left: enough, nothing written
    assert on_disk(holder) == taken
    clock.now += 0.2
    holder.hold(2.0)  # 1.9 s left: renewed
    assert on_disk(holder)["renewed_at"] == clock.now == holder.renewed_at
    clock.now += 3.1  # not renewed within its TTL: lapsed, and taken over
    successor = CheckerLease(str(tmp_path), ttl_s=3.0, clock=clock).acquire()
    with pytest.raises(LeaseLostError):
        holder.hold(2.0)
    assert on_disk(successor)["owner"] == successor.owner
    with pytest.raises(LeaseLostError):  # a refused renewal is never taken for a holding
        holder.hold(0.0)


def test_hold_after_a_renewal_that_found_the_lease_taken_asks_the_storage_again(tmp_path):
    clock = Clock()
    holder = CheckerLease(str(tmp_path), ttl_s=3.0, clock=clock).acquire()
    # Taken by a checker whose clock is ahead (holders must share one: this one does not).
    CheckerLease(str(tmp_path), ttl_s=3.0, clock=lambda: clock.now + 3600).acquire()
    holder.hold(2.0)  # renewed a moment ago by this holder's clock: no request, so not noticed yet
    with pytest.raises(LeaseLostError):
        holder.renew()  # the renewer's next round notices
    with pytest.raises(LeaseLostError):
        holder.hold(2.0)  # and every batch after it asks the storage, and stops
