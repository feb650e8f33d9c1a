"""What the checker has done, kept in the lakehouse so that a lost streaming checkpoint is noticed and repaired.

Spark's streaming checkpoint says which commit-log versions the checker has read; the
lakehouse says what it wrote. They must agree. ``system/_checker_progress.json``
ties them together:

* the **epoch**: which checkpoint the lakehouse is served by (its id), the global
  batch id of that checkpoint's batch 0, and the version of each commit log it starts at;
* the **last batch**, recorded *before* that batch writes anything: its global id,
  the versions of each commit log it covers and its clock.

A record written before each group had its own commit log names versions of the one shared log
(``system/commit_log``); it is read as such, for ``txcoord upgrade``.

On start, :func:`verify_streaming_checkpoint` compares the streaming checkpoint with this record and
refuses one that is missing, belongs to another query, or is older than
the lakehouse. :func:`CheckerProgress.next_epoch` is the recovery path: replay the
last recorded batch exactly (its writes are idempotent) and start a new checkpoint
at the first versions after it, with batch ids that keep increasing.

Reading this file needs no JVM: ``txcoord status`` and maintenance use it too. Each save
replaces the version this checker last read or wrote, and nothing else
(:mod:`coordinator.storage`): a checker whose lease was taken over fails its next batch
at the announcement, before writing anything, on a local disk or on object storage alike.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Mapping, Optional, Union

from coordinator.exceptions import CheckpointMismatchError, LeaseLostError, WriteOutcomeUnknownError
from coordinator.lakehouse import PROGRESS_KEY, SHARED_LOG_KEY, Lakehouse
from coordinator.storage import FileStore

__all__ = ["BatchRecord", "CheckerProgress", "Epoch", "Progress", "StreamingCheckpoint", "verify_streaming_checkpoint"]


@dataclass(frozen=True)
class Epoch:
    """One streaming checkpoint's life on the lakehouse.

    ``checkpoint_id`` is the streaming query's id (the checkpoint's ``metadata`` file),
    ``None`` until the epoch's query first starts; ``starting_versions`` the first version of
    each commit log it reads (a log not named starts at 0). ``shared_log``: the epoch of a checker
    of the one shared commit log (read from a record in the earlier format).
    """

    number: int
    first_batch_id: int
    starting_versions: dict[str, int]
    checkpoint_id: Optional[str] = None
    shared_log: bool = False


@dataclass(frozen=True)
class BatchRecord:
    """A batch as announced before its writes.

    ``starts``/``ends`` bound the versions of each commit log it read (``ends``: the first version
    no batch up to this one has read); ``now_us`` is its clock; ``pending_from`` is the queue offset
    below which every half was resolved before it. ``shared_log``: announced by a checker of the
    shared commit log, whose queue offsets follow that log's versions.
    """

    batch_id: int
    stream_batch_id: int
    starts: dict[str, int]
    ends: dict[str, int]
    now_us: int
    pending_from: int = 0
    shared_log: bool = False


@dataclass(frozen=True)
class Progress:
    epoch: Epoch
    last_batch: Optional[BatchRecord] = None

    @property
    def next_versions(self) -> dict[str, int]:
        """The first version of each commit log the checker has not read."""
        return dict(self.last_batch.ends if self.last_batch else self.epoch.starting_versions)

    @property
    def pending_from(self) -> int:
        """A queue offset below which every half is resolved (0 before any batch)."""
        return self.last_batch.pending_from if self.last_batch else 0

    @property
    def oldest_needed_versions(self) -> dict[str, int]:
        """The oldest version of each commit log the checker may still read: its last batch may be replayed."""
        return dict(self.last_batch.starts if self.last_batch is not None else self.epoch.starting_versions)

    @property
    def next_batch_id(self) -> int:
        """The global id the next new batch (after the last recorded one) gets."""
        return self.last_batch.batch_id + 1 if self.last_batch else self.epoch.first_batch_id


def _progress_of(raw: dict) -> Progress:
    """The progress a record holds, in either format (see the module's docstring)."""
    epoch, last = dict(raw["epoch"]), raw.get("last_batch")
    if "starting_version" in epoch:  # the shared commit log's
        epoch.update(starting_versions={SHARED_LOG_KEY: epoch.pop("starting_version")}, shared_log=True)
        if last:
            last = dict(last)
            first, following = last.pop("first_version"), last.pop("next_version")
            last.pop("last_version")
            last.update(starts={SHARED_LOG_KEY: following if first is None else first},
                        ends={SHARED_LOG_KEY: following}, shared_log=True)
    return Progress(epoch=Epoch(**epoch), last_batch=BatchRecord(**last) if last else None)


@dataclass(frozen=True)
class StreamingCheckpoint:
    """What a streaming checkpoint directory holds: its query id and its highest batch ids."""

    exists: bool
    checkpoint_id: Optional[str] = None
    last_planned_batch: Optional[int] = None  # highest ``offsets/`` entry
    #: Its offsets are an earlier source's: Delta's change feed, or the one shared commit log's.
    outdated_offsets: bool = False

    @classmethod
    def read(cls, location: str, storage: Optional[Mapping[str, str]] = None) -> "StreamingCheckpoint":
        """Inspect the checkpoint at ``location`` (a directory, or object storage reached with
        ``storage``) without starting Spark.

        Example::

            StreamingCheckpoint.read("lakehouse/system/_checkpoints/checker").checkpoint_id
        """
        files = FileStore.at(location, storage)
        metadata = files.read("metadata")
        if metadata is None:
            return cls(exists=False)
        try:
            checkpoint_id = json.loads(metadata.data).get("id")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            checkpoint_id = None
        names = [key.rsplit("/", 1)[-1] for key in files.list("offsets")]
        last = max((int(name) for name in names if name.isdigit()), default=None)
        outdated = last is not None and b'"versions"' not in files.read(f"offsets/{last}").data
        return cls(exists=True, checkpoint_id=checkpoint_id, last_planned_batch=last, outdated_offsets=outdated)


class CheckerProgress:
    """The progress record of one lakehouse's checker.

    Example::

        progress = CheckerProgress("lakehouse")
        progress.load()            # None before the first checker ever ran
    """

    def __init__(self, lakehouse: Union[str, Lakehouse]):
        lakehouse = Lakehouse.at(lakehouse)
        self.path = lakehouse.progress_file
        self.files = lakehouse.files
        self._version: Optional[str] = None  # of the record as this object last read or wrote it
        self._unconfirmed: Optional[bytes] = None  # a write whose outcome the storage never told

    def load(self) -> Optional[Progress]:
        """The recorded progress, or ``None`` if no checker has recorded any."""
        current = self.files.read(PROGRESS_KEY)
        if current is None:
            self._version = None
            return None
        try:
            raw = json.loads(current.data)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise CheckpointMismatchError(f"{self.path} is unreadable ({error}); restore it from a backup") from None
        self._version = current.version
        return _progress_of(raw)

    def save(self, progress: Progress) -> None:
        """Replace the record as this object last read or wrote it (whole, or not at all).

        Raises :class:`~coordinator.exceptions.LeaseLostError` if another checker changed it since:
        this one's lease was taken over.
        """
        data = json.dumps({"epoch": asdict(progress.epoch),
                           "last_batch": asdict(progress.last_batch) if progress.last_batch else None}).encode()
        if self._unconfirmed is not None:
            self._confirm(self._unconfirmed)
        try:
            if self._version is None:
                version = self.files.create(PROGRESS_KEY, data)
            else:
                version = self.files.replace(PROGRESS_KEY, data, self._version)
        except WriteOutcomeUnknownError:
            self._unconfirmed = data  # the next save learns whether it was made
            raise
        if version is None:
            raise LeaseLostError(f"{self.path} was changed by another checker since this one read it: its lease was "
                                 "taken over, and it must stop")
        self._version = version

    def _confirm(self, unconfirmed: bytes) -> None:
        """After a save whose outcome was unknown: if it was made, the record's version is now its own."""
        current = self.files.read(PROGRESS_KEY)
        if current is not None and current.data == unconfirmed:
            self._version = current.version
        self._unconfirmed = None

    def begin(self, checkpoint: StreamingCheckpoint) -> Progress:
        """Check ``checkpoint`` against the record and return the progress to run with.

        A first run starts epoch 0 at version 0 of every log. Raises :class:`CheckpointMismatchError`
        when the checkpoint is missing, foreign or stale (see :func:`verify_streaming_checkpoint`).
        """
        progress = self.load()
        if progress is None:
            progress = Progress(Epoch(number=0, first_batch_id=0, starting_versions={},
                                      checkpoint_id=checkpoint.checkpoint_id))
            self.save(progress)
            return progress
        verify_streaming_checkpoint(progress, checkpoint, self.path)
        return progress

    def adopt(self, progress: Progress, checkpoint_id: str) -> Progress:
        """Record the id of the checkpoint a new epoch's query just created."""
        if progress.epoch.checkpoint_id == checkpoint_id:
            return progress
        adopted = replace(progress, epoch=replace(progress.epoch, checkpoint_id=checkpoint_id))
        self.save(adopted)
        return adopted

    def next_epoch(self, progress: Progress, first_batch_id: Optional[int] = None) -> Progress:
        """Start a new epoch after the last recorded batch: a fresh checkpoint begins there, its
        batches numbered from ``first_batch_id`` (by default, right after the last recorded one;
        never lower)."""
        epoch = Epoch(number=progress.epoch.number + 1,
                      first_batch_id=max(progress.next_batch_id, first_batch_id or 0),
                      starting_versions=progress.next_versions)
        following = Progress(epoch=epoch)
        self.save(following)
        return following


def verify_streaming_checkpoint(progress: Progress, checkpoint: StreamingCheckpoint, record_path: str) -> None:
    """Raise :class:`CheckpointMismatchError` unless ``checkpoint`` is the one ``progress`` was made with.

    Example::

        verify_streaming_checkpoint(progress, StreamingCheckpoint.read(location), progress_path)
    """
    epoch, last = progress.epoch, progress.last_batch
    recovery = "run the checker once with --recover-checkpoint to continue after the last recorded batch (see README)"
    if not checkpoint.exists:
        if epoch.checkpoint_id is None and last is None:
            return  # a new epoch whose query has not started yet
        raise CheckpointMismatchError(
            f"the checker's checkpoint is missing, but {record_path} shows epoch {epoch.number} processed the commit logs "
            f"up to batch {last.batch_id if last else '-'} ({_versions(progress.next_versions)}); {recovery}"
        )
    if epoch.checkpoint_id is not None and checkpoint.checkpoint_id != epoch.checkpoint_id:
        raise CheckpointMismatchError(
            f"the checker's checkpoint belongs to query {checkpoint.checkpoint_id}, not to {epoch.checkpoint_id} which "
            f"{record_path} records for this lakehouse (a checkpoint from another lakehouse?); {recovery}"
        )
    if checkpoint.outdated_offsets:
        raise CheckpointMismatchError(
            "the checker's checkpoint was written by an earlier version, which read one commit log shared by every "
            f"group (or Delta's change feed); this one reads each group's log. {recovery[0].upper()}{recovery[1:]}"
        )
    planned = None if checkpoint.last_planned_batch is None else epoch.first_batch_id + checkpoint.last_planned_batch
    if last is not None and (planned is None or planned < last.batch_id):
        raise CheckpointMismatchError(
            f"the checker's checkpoint stops at batch {planned if planned is not None else 'none'}, older than batch "
            f"{last.batch_id} that {record_path} shows was processed (a checkpoint restored from an old copy?); {recovery}"
        )


def _versions(versions: Mapping[str, int]) -> str:
    return ", ".join(f"{key} before version {version}" for key, version in sorted(versions.items())) or "no version"
