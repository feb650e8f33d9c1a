"""Starting a new epoch: replay the last announced batch, set the checkpoint aside, continue after it.

What ``--recover-checkpoint`` and ``txcoord upgrade`` share. Needs no JVM: the batch is replayed
on the driver, over exactly the versions and clock its announcement recorded, so each of its
writes lands once whether or not it had been made.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional

from coordinator.checker.batch import run_batch
from coordinator.checker.context import COMMITS_PER_BATCH
from coordinator.checker.segment import Segment
from coordinator.config import CoordinatorConfig
from coordinator.control.progress import CheckerProgress, Progress
from coordinator.lakehouse import SHARED_LOG_KEY, Lakehouse

__all__ = ["begin_next_epoch", "replay_last_batch"]

log = logging.getLogger("coordinator.checker")


def replay_last_batch(config: CoordinatorConfig, progress: Progress, app_id: str) -> None:
    """Run the last batch ``progress`` announced again, as announced (a no-op without one)."""
    last = progress.last_batch
    if last is not None:
        records = Segment(last.starts, last.ends, last.now_us).records(Lakehouse.of(config))
        run_batch(config, records, last.batch_id, app_id, last.pending_from, shared_log=last.shared_log)


def begin_next_epoch(config: CoordinatorConfig, store: CheckerProgress, progress: Progress, app_id: str,
                     first_batch_id: Optional[int] = None) -> Progress:
    """Replay the last announced batch, set the checker's checkpoint aside and record a new epoch that
    starts after that batch (its batch ids from ``first_batch_id`` if higher). Nothing is re-delivered
    and nothing is skipped. The caller holds the checker's lease.

    After an epoch of the one shared commit log, whose queue offsets followed that log's versions,
    the batch ids jump high enough that every later queue offset is higher (see
    :mod:`coordinator.checker.context`).

    Example::

        begin_next_epoch(config, CheckerProgress(lakehouse), CheckerProgress(lakehouse).load(), "txcoord-checker")
    """
    replay_last_batch(config, progress, app_id)
    location = Lakehouse.of(config).checker_checkpoint
    if os.path.exists(location):
        aside = f"{location}.replaced-{time.strftime('%Y%m%dT%H%M%S')}"
        os.rename(location, aside)
        log.warning("checker checkpoint %s set aside as %s", location, aside)
    if progress.epoch.shared_log:
        beyond_shared = progress.next_versions.get(SHARED_LOG_KEY, 0) // COMMITS_PER_BATCH + 1
        first_batch_id = max(first_batch_id or 0, beyond_shared)
    following = store.next_epoch(progress, first_batch_id)
    log.warning("checker epoch %d starts with batch %d at %s", following.epoch.number, following.epoch.first_batch_id,
                ", ".join(f"{key} version {version}" for key, version in sorted(following.epoch.starting_versions.items()))
                or "the first version of every commit log")
    return following
