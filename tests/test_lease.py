"""One active checker per lakehouse: the lease refuses a second holder and expires when its holder dies."""

import json
import time

import pytest

from coordinator.checker.lease import CheckerLease
from coordinator.exceptions import CheckerAlreadyRunningError, LeaseLostError


def test_second_checker_is_refused_while_the_first_renews(tmp_path):
    first = CheckerLease(str(tmp_path), ttl_s=1.0).acquire()
    with pytest.raises(CheckerAlreadyRunningError, match=r"pid \d+"):
        CheckerLease(str(tmp_path), ttl_s=1.0).acquire()
    time.sleep(0.6)
    first.renew()
    time.sleep(0.6)  # 1.2 s after acquiring, but renewed 0.6 s ago
    with pytest.raises(CheckerAlreadyRunningError):
        CheckerLease(str(tmp_path), ttl_s=1.0).acquire()


def test_a_dead_holder_is_taken_over_and_then_must_stop(tmp_path):
    dead = CheckerLease(str(tmp_path), ttl_s=0.3).acquire()
    time.sleep(0.5)  # no renewal: the holder is gone
    successor = CheckerLease(str(tmp_path), ttl_s=0.3).acquire()
    with pytest.raises(LeaseLostError):
        dead.renew()
    successor.renew()
    dead.release()  # not its lease any more: must leave the successor's alone
    assert json.loads(open(successor.path).read())["owner"] == successor.owner


def test_release_lets_the_next_checker_start_at_once(tmp_path):
    CheckerLease(str(tmp_path)).acquire().release()
    CheckerLease(str(tmp_path)).acquire()


def test_an_unreadable_lease_file_is_replaced(tmp_path):
    lease = CheckerLease(str(tmp_path))
    (tmp_path / "system").mkdir()
    open(lease.path, "w").write("{half-written")
    lease.acquire()
    lease.renew()
