"""A share an instance holds: what it has read of the share's messages, what is left to handle, and the progress
record that says so (:class:`~coordinator.consumer.group.ShareProgress`).

A share reads its source (a topic, or the group's redrive table; :mod:`.topic_log`) in the topic's order: first
the messages its record lists as unhandled (read again from their versions), then on from its position, a
version's rows in queue-offset order, at most ``consumer_max_buffered`` messages held at once: a position may
fall inside a version. Its record lists what is not handled below that position, so it is as small as the
buffer, whatever one message does.

When a version it needs is gone (log cleanup removed its commit, or vacuum its data file), the share follows
``consumer_position_gone`` (:meth:`Share.position_gone`): ``earliest`` reads what the topic still holds from a
snapshot (every message of the share from the batch it had reached on, and those it listed as unhandled),
``latest`` moves past every message now, ``fail`` stops the share with the error.

Example::

    share = Share("ORDER_TOPIC", 3, log, progress, file_version, now=time.time())
    share.fill(latest=41, room=1000)
    [p.offset for p in share.pending]   # the messages read and not handled, in the topic's order
"""

from __future__ import annotations

import bisect
import logging
from typing import Optional

from coordinator.consumer.group import MAX_ERROR_CHARS, ShareProgress, share_of
from coordinator.consumer.topic_log import TopicLog
from coordinator.exceptions import PositionGoneError

__all__ = ["Pending", "Share"]

_log = logging.getLogger("coordinator.consumer")


class Pending:
    """A message of a share not handled yet, with its retry state (slots: one is made per message read)."""

    __slots__ = ("row", "version", "offset", "lane", "attempts", "due_ms", "error", "dead", "inflight")

    def __init__(self, row: dict, version: int, offset: int, retry: Optional[dict]):
        self.row, self.version, self.offset = row, version, offset
        self.lane = row["keys"] or f"\0{row['msg_id']}"  # a key's messages run one after another
        self.attempts = self.due_ms = 0
        self.error: Optional[str] = None
        self.dead = self.inflight = False
        if retry is not None:
            self.attempts, self.due_ms, self.error, self.dead = (retry["attempts"], retry["due_ms"], retry["error"],
                                                                 retry.get("dead", False))


class Share:
    """Share ``number`` of ``source``, as this instance holds it (see the module's docstring). Used by the
    consumer's loop thread alone."""

    def __init__(self, source: str, number: int, shares: int, log: TopicLog, progress: ShareProgress,
                 file_version: Optional[str], now: float):
        self.source, self.number, self.shares, self.log = source, number, shares, log
        self.floor, self.epoch = progress.floor, progress.epoch
        self.next_read, self.next_offset = progress.version, progress.offset
        self.topic_rows_before = progress.topic_rows_before
        self.snapshot, self.snapshot_from_batch = progress.snapshot, progress.snapshot_from_batch
        self.batch = progress.batch  # the checker batch of the last version read from its position
        self.gone = progress.gone  # the last time a version it needed was gone
        #: Unhandled messages of versions before the position, to read again before going on (version -> offsets).
        self.reread = {version: set(offsets) for version, offsets in progress.unhandled.items()}
        self.retries = dict(progress.retrying)  # (version, offset) -> retry state, taken as the message is read
        self.skip = {version: set(offsets) for version, offsets in progress.skip.items()}
        #: The messages read and not handled, in the topic's order (a dict as an ordered set: one is removed
        #: in O(1) whichever finishes first).
        self.pending: dict[Pending, None] = {}
        self.read_count = 0  # messages read since the share was taken
        self.file_version = file_version
        self.dirty = file_version is None
        self.saved_at = now
        self.releasing = False
        self.failure: Optional[str] = None  # why the share cannot be read now (logged once)
        self.stopped: Optional[BaseException] = None  # an error it does not retry: nothing more is read or started
        self.claim: Optional[str] = None  # the version of this instance's claim of the share

    def progress(self) -> ShareProgress:
        """The record of where the share is now."""
        unhandled: dict[int, list[int]] = {version: sorted(offsets) for version, offsets in self.reread.items()}
        retrying = {key: retry for key, retry in self.retries.items() if key[0] in self.reread or key[0] == -1}
        for pending in self.pending:
            unhandled.setdefault(pending.version, []).append(pending.offset)
            if pending.attempts:
                retrying[pending.version, pending.offset] = {
                    "attempts": pending.attempts, "due_ms": pending.due_ms,
                    "error": None if pending.error is None else pending.error[:MAX_ERROR_CHARS], "dead": pending.dead}
        skip = {version: sorted(offsets) for version, offsets in self.skip.items() if version >= self.next_read}
        in_snapshot = self._in_snapshot(unhandled)
        return ShareProgress(self.next_read, self.next_offset, self.floor, unhandled, retrying, self.epoch,
                             self.topic_rows_before, skip, self.snapshot if in_snapshot else None,
                             self.snapshot_from_batch if in_snapshot else None, self.batch, self.gone)

    def _in_snapshot(self, unhandled: dict) -> bool:
        return self.snapshot is not None and (self.next_read == self.snapshot or self.snapshot in unhandled)

    def handled(self, pending: Pending) -> None:
        self.pending.pop(pending, None)
        self.dirty = True

    def fill(self, latest: int, room: int) -> None:
        """Read on until the share holds ``room`` messages or has read every version up to ``latest``: first the
        unhandled messages its record listed, then on from its position. Raises :class:`PositionGoneError` when a
        version it needs is gone (:meth:`position_gone` moves it on)."""
        pending = self.pending
        while self.reread and len(pending) < room:
            version = min(self.reread)
            offsets = self.reread[version]
            for row in self._rows(version):
                if row["queue_offset"] in offsets:
                    self._hold(row, version)
            del self.reread[version]
            self.dirty = True
        while len(pending) < room and self.next_read <= latest:
            version = self.next_read
            rows = self._rows(version)
            start = bisect.bisect_left(rows, self.next_offset, key=_offset) if self.next_offset else 0
            skip, floor = self.skip.get(version, ()), self.floor
            from_batch = self.snapshot_from_batch if version == self.snapshot else None
            if version != self.snapshot:
                self.batch = self.log.batch_of(version)
            for index in range(start, len(rows)):
                row = rows[index]
                if len(pending) >= room:
                    self.next_offset = row["queue_offset"]
                    self.dirty = True
                    return
                offset = row["queue_offset"]
                if offset < floor or offset in skip or (from_batch is not None and (row.get("batch_id") or 0) < from_batch):
                    continue
                self._hold(row, version)
            if version == self.snapshot:  # every message of the versions up to it: counted again from here
                self.topic_rows_before = self.log.snapshot_row_count(version)
            elif self.topic_rows_before is not None:
                self.topic_rows_before += self.log.row_count(version)
            self.next_read, self.next_offset = version + 1, 0
            self.skip.pop(version, None)
            self.dirty = True

    def _rows(self, version: int) -> list[dict]:
        if version == self.snapshot:
            return self.log.snapshot_share_rows(version, self.number, self.shares, share_of)
        return self.log.share_rows(version, self.number, self.shares, share_of)

    def _hold(self, row: dict, version: int) -> None:
        offset = row["queue_offset"]
        retries = self.retries
        retry = (retries.pop((version, offset), None) or retries.pop((-1, offset), None)) if retries else None
        self.pending[Pending(row, version, offset, retry)] = None
        self.read_count += 1

    def position_gone(self, error: PositionGoneError, policy: str, latest: int, now: float) -> str:
        """Move the share on from a version that is gone, as ``policy`` says (``consumer_position_gone``); what was
        done, for the log and the counter, and kept in the share's record (``gone``) with ``now``. With ``fail``,
        the share stops with ``error``. A share that has read
        nothing yet (a new group starting at ``earliest`` on a topic whose first versions are gone) reads the
        snapshot whatever the policy: what it asked for is every message the topic holds.

        ``earliest``: the share reads the topic's snapshot at ``latest`` (what the table holds now, in queue-offset
        order): the messages of the checker's batches it had not read whole, and those it listed as unhandled,
        then goes on after ``latest``. A message of a batch it had read in part is delivered again (at least once).
        """
        needed = min(self.reread, default=self.next_read)
        outcome = self._move_on(error, policy, latest)
        self.gone = {"at_ms": int(now * 1000), "version": needed, "policy": policy, "outcome": outcome[:300]}
        self.dirty = True
        return outcome

    def _move_on(self, error: PositionGoneError, policy: str, latest: int) -> str:
        fresh = self.batch is None and self.snapshot is None and not self.pending and not self.reread
        if not fresh and policy == "fail":
            self.stopped = error
            return "stopped"
        offsets = set().union(*self.reread.values())  # listed, not read again yet (those held stay held)
        self.reread.clear()
        self.topic_rows_before = None
        self.dirty = True
        if latest < 0 or policy == "latest" and not fresh:
            self.next_read, self.next_offset = latest + 1, 0
            self.retries.clear()
            return f"moved past version {latest}: the messages of the versions gone are not delivered"
        self.snapshot_from_batch = None if self.batch is None else self.batch + (1 if not self.next_offset else 0)
        self.snapshot = self.next_read = latest
        self.reread = {latest: offsets} if offsets else {}
        self.skip = {latest: offsets | {p.offset for p in self.pending}}  # held already: not held twice
        self.retries = {(latest, offset): retry for (_, offset), retry in self.retries.items() if offset in offsets}
        return (f"reads the snapshot of version {latest} from checker batch {self.snapshot_from_batch} "
                f"({len(offsets)} unhandled message(s) listed)")


def _offset(row: dict) -> int:
    return row["queue_offset"]
