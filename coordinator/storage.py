"""The small files of a lakehouse (the checker's lease and progress record, producer instances),
with the conditional writes that make them safe: on a local disk, an S3-compatible bucket or an
Azure Blob Storage / ADLS Gen2 container.

A file is read with its *version* (on S3 and Azure, its ETag; on a local disk, a hash of its content),
and replaced only if it is still at that version, or created only if absent. That is all a
lease and a progress record need to stay single-writer, on either kind of storage: two
processes racing to replace the same version see one win and one refused.

On object storage every request is retried, bounded and counted, by :mod:`coordinator.retries`
(throttling, server errors, timeouts, lost connections). A conditional write is where a retry
is ambiguous: if its first attempt was made but the reply lost, the retry is refused as if
another writer had won. :meth:`FileStore.create` and :meth:`FileStore.replace` then read the file:
holding exactly what this writer wrote, it is this writer's (every caller's content is unique
to it), and the write is reported made.

Object storage is reached through ``obstore`` (the Rust ``object_store`` crate, the one delta-rs
uses), so the same settings serve both: ``AWS_*`` environment variables, or the coordinator
TOML's ``[storage]`` table (the same keys, e.g. ``aws_endpoint``, ``aws_allow_http``; on Azure
``azure_storage_account_name``, ``azure_storage_account_key``, ``azure_storage_endpoint``, ``allow_http``).

Example::

    files = FileStore.at("s3://bucket/lakehouse", {"aws_endpoint": "http://127.0.0.1:9000"})
    files.create("system/_checker_lease.json", b"{...}")        # the new version, or None if it exists
    current = files.read("system/_checker_lease.json")          # Versioned(data, version), or None
    files.replace("system/_checker_lease.json", b"{...}", current.version)  # None if it changed since
"""

from __future__ import annotations

import abc
import datetime as dt
import fcntl
import functools
import hashlib
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, NamedTuple, Optional, Sequence, TypeVar
from urllib.parse import urlparse

import obstore
from obstore.exceptions import AlreadyExistsError, PermissionDeniedError, PreconditionError, UnauthenticatedError
from obstore.store import AzureStore, S3Store

from coordinator.exceptions import AccessDeniedError, FileTooLargeError, InvalidArgumentError
from coordinator.retries import RETRY_SETTINGS, RetryPolicy, note_own_write_recognised, retrying

__all__ = ["CONCURRENT_READS", "FileStore", "Listing", "Versioned", "denied_as_error", "is_object_store", "read_all"]

_T = TypeVar("_T")
_R = TypeVar("_R")
#: Location schemes of S3-compatible storage.
S3_SCHEMES = ("s3", "s3a")
#: Location schemes of Azure Blob Storage and ADLS Gen2 (those object_store, so obstore and delta-rs, read as Azure:
#: ``abfss://container@account.dfs.core.windows.net/prefix``, ``az://container/prefix`` with the account in ``[storage]``).
AZURE_SCHEMES = ("abfss", "abfs", "az", "azure", "adl")
#: Location schemes served by object storage; anything else is a local path. Not ``gs``: no emulator that speaks
#: GCS's XML API and its generation preconditions, as object_store does, installs here to test it (docs/known-limits.md).
OBJECT_SCHEMES = S3_SCHEMES + AZURE_SCHEMES
#: ``[storage]`` keys that let object_store's HTTP client speak plain HTTP (an emulator on loopback): a client
#: option for obstore, a storage option delta-rs reads itself.
ALLOW_HTTP_SETTINGS = ("aws_allow_http", "azure_allow_http", "allow_http")


class Versioned(NamedTuple):
    """A file's content, the version it was read at, and when it was last written (epoch
    milliseconds; a time the server gives in whole seconds is rounded up, never down)."""

    data: bytes
    version: str
    modified_ms: int


class Listing(NamedTuple):
    """What :meth:`FileStore.listing` found right under a prefix: directories' names (sorted), and each
    file's name with a tag that changes whenever the file is written."""

    directories: list[str]
    files: dict[str, str]


#: Reads made at once by :func:`read_all` on object storage, where each is a request of tens of milliseconds.
CONCURRENT_READS = 16


def read_all(read: Callable[[_T], _R], items: Sequence[_T], remote: bool, at_once: int = CONCURRENT_READS) -> list[_R]:
    """``read`` of each of ``items``, in their order: at most ``at_once`` at once when ``remote``
    (object storage), one after another on a local disk (a thread per read costs more than the read).

    Example::

        read_all(lambda key: files.read(key), keys, remote=not lakehouse.is_local)
    """
    if not remote or len(items) <= 1:
        return [read(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(at_once, len(items))) as reads:
        return list(reads.map(read, items))


def is_object_store(location: str) -> bool:
    """Whether ``location`` names object storage (``s3://bucket/prefix``, ``abfss://container@account.dfs.core.windows.net/prefix``)
    rather than a local path."""
    return urlparse(location).scheme in OBJECT_SCHEMES


@contextmanager
def denied_as_error(location: str) -> Iterator[None]:
    """Raise :class:`AccessDeniedError` naming ``location`` for a request the storage refused to these
    credentials, whichever client made it (obstore, delta-rs, pyarrow, the local filesystem): their
    own errors name an HTTP status or an errno, not what the principal lacks.

    Example::

        with denied_as_error("s3://lakehouse/lh/groups/order_group/commit_log"):
            DeltaTable(...)
    """
    try:
        yield
    except AccessDeniedError:
        raise
    except Exception as error:
        if not _is_access_denied(error):
            raise
        raise AccessDeniedError(f"{location}: access denied by the storage to these credentials (`txcoord grants` "
                                f"lists what each principal may read and write): "
                                f"{str(error).strip().splitlines()[0]}") from error


def _is_access_denied(error: Exception) -> bool:
    if isinstance(error, (PermissionError, PermissionDeniedError, UnauthenticatedError)):
        return True
    # delta-rs and obstore's listings report a refusal as a generic error carrying the HTTP answer.
    return any(mark in str(error) for mark in ("403 Forbidden", "<Code>AccessDenied</Code>", "ACCESS_DENIED"))


def _naming_denied_paths(method: Callable) -> Callable:
    """A file store's ``method(key, ...)``, refused access raising :class:`AccessDeniedError` with the file's location."""
    @functools.wraps(method)
    def named(store: "FileStore", key: str, *args, **kwargs):
        with denied_as_error(store.location(key)):
            return method(store, key, *args, **kwargs)
    return named


class FileStore(abc.ABC):
    """Small files under one root, read with their version and written conditionally.

    Use :meth:`at` to get the store of a location; keys are relative to its root, ``/``-separated.
    """

    #: Whether each request crosses a network (object storage), so that reads go side by side (:func:`read_all`).
    remote = False

    @staticmethod
    def at(root: str, options: Optional[Mapping[str, str]] = None) -> "FileStore":
        """The store for ``root``: a local directory, or ``s3://bucket/prefix`` or an Azure location with
        ``options`` (``object_store``'s keys; ``AWS_*`` / ``AZURE_*`` environment variables fill in the rest).

        Example::

            FileStore.at("/data/lakehouse").read("system/_checker_progress.json")
        """
        return ObjectFileStore(root, options or {}) if is_object_store(root) else LocalFileStore(root)

    @abc.abstractmethod
    def location(self, key: str) -> str:
        """Where the file ``key`` is: a path, or an ``s3://`` URL."""

    @abc.abstractmethod
    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[Versioned]:
        """The file's content and version, or ``None`` if there is no such file; a file larger than
        ``max_bytes`` raises :class:`FileTooLargeError` before its content is read."""

    @abc.abstractmethod
    def read_range(self, key: str, start: int, end: int) -> Optional[bytes]:
        """Bytes ``start`` to ``end`` (not included) of the file (a ranged GET on object storage), or ``None`` if
        there is no such file."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether the file exists."""

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> Optional[str]:
        """Write the file only if it does not exist; return its version, or ``None`` if it existed.

        ``data`` must be unique to this writer (an id, a holder and time): a retried create that finds
        exactly ``data`` in place takes it as its own. Raises
        :class:`~coordinator.exceptions.WriteOutcomeUnknownError` when the storage never told."""

    @abc.abstractmethod
    def replace(self, key: str, data: bytes, version: str) -> Optional[str]:
        """Overwrite the file only if it is still at ``version``; return the new version, or ``None``
        if it changed or is gone. ``data`` must be unique to this writer, as for :meth:`create`."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> int:
        """Write the file, whatever was there (whole or not at all); return when it was written, in
        epoch milliseconds (its modification time, as Delta's ``add`` actions record it)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the file if it exists."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """The keys of the files under ``prefix`` (a directory-like key), sorted."""

    def list_after(self, prefix: str, after: str, max_keys: int) -> Optional[list[str]]:
        """Up to ``max_keys`` keys of the files right under ``prefix`` that sort after the key ``after``, in
        order, from one listing request where the storage starts a listing there (S3's ``start-after``);
        ``None`` where it cannot (a local disk, where a probe costs nothing; Azure, which lists from the
        start)."""
        return None

    @abc.abstractmethod
    def modified(self, prefix: str) -> dict[str, int]:
        """The files right under ``prefix``: each key with when it was last written (epoch milliseconds)."""

    def directories(self, prefix: str) -> list[str]:
        """The names of the directories (on S3: common prefixes) right under ``prefix``, sorted."""
        return self.listing(prefix).directories

    @abc.abstractmethod
    def listing(self, prefix: str) -> "Listing":
        """What is right under ``prefix``, from one listing (on object storage, one request a thousand entries):
        the directories' names, sorted, and each file's name with a tag that changes whenever the file is
        written (its ETag on object storage)."""


class LocalFileStore(FileStore):
    """A local directory. A file appears whole (written aside, then linked or renamed into place);
    a replace holds an exclusive ``flock`` on a sidecar ``<file>.lock`` while it compares and renames,
    so processes of this host racing on one file are serialised."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def location(self, key: str) -> str:
        return self._path(key)

    @_naming_denied_paths
    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[Versioned]:
        try:
            with open(self._path(key), "rb") as file:
                stat = os.fstat(file.fileno())
                _check_size(key, stat.st_size, max_bytes, stat.st_mtime_ns // 1_000_000)
                data = file.read()
                modified_ns = stat.st_mtime_ns
        except FileNotFoundError:
            return None
        return Versioned(data, _local_version(data), modified_ns // 1_000_000)

    @_naming_denied_paths
    def read_range(self, key: str, start: int, end: int) -> Optional[bytes]:
        try:
            with open(self._path(key), "rb") as file:
                file.seek(start)
                return file.read(end - start)
        except FileNotFoundError:
            return None

    @_naming_denied_paths
    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    @_naming_denied_paths
    def create(self, key: str, data: bytes) -> Optional[str]:
        path = self._path(key)
        staged = self._stage(path, data)
        try:
            os.link(staged, path)  # fails if the name exists: an atomic create-if-absent, with the content in place
        except FileExistsError:
            return None
        finally:
            os.remove(staged)
        return _local_version(data)

    @_naming_denied_paths
    def replace(self, key: str, data: bytes, version: str) -> Optional[str]:
        path = self._path(key)
        with self._locked(path):
            current = self.read(key)
            if current is None or current.version != version:
                return None
            os.replace(self._stage(path, data), path)
            return _local_version(data)

    @_naming_denied_paths
    def put(self, key: str, data: bytes) -> int:
        path = self._path(key)
        os.replace(self._stage(path, data), path)
        return os.stat(path).st_mtime_ns // 1_000_000

    @_naming_denied_paths
    def delete(self, key: str) -> None:
        try:
            os.remove(self._path(key))
        except FileNotFoundError:
            pass

    @_naming_denied_paths
    def list(self, prefix: str) -> list[str]:
        directory = self._path(prefix)
        if not os.path.isdir(directory):
            return []
        return sorted(f"{prefix.rstrip('/')}/{name}" for name in os.listdir(directory)
                      if not name.startswith(".") and os.path.isfile(os.path.join(directory, name)))

    @_naming_denied_paths
    def modified(self, prefix: str) -> dict[str, int]:
        directory = self._path(prefix)
        if not os.path.isdir(directory):
            return {}
        return {f"{prefix.rstrip('/')}/{entry.name}": entry.stat().st_mtime_ns // 1_000_000
                for entry in os.scandir(directory) if entry.is_file() and not entry.name.startswith(".")}

    @_naming_denied_paths
    def listing(self, prefix: str) -> "Listing":
        directory = self._path(prefix)
        if not os.path.isdir(directory):
            return Listing([], {})
        directories, files = [], {}
        for entry in os.scandir(directory):
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                directories.append(entry.name)
            elif entry.is_file():
                stat = entry.stat()
                files[entry.name] = f"{stat.st_mtime_ns}-{stat.st_size}"
        return Listing(sorted(directories), files)

    @staticmethod
    def _stage(path: str, data: bytes) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        staged = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}")
        with open(staged, "wb") as file:
            file.write(data)
        return staged

    @staticmethod
    @contextmanager
    def _locked(path: str) -> Iterator[None]:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{os.path.join(os.path.dirname(path), '.' + os.path.basename(path))}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _local_version(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class ObjectFileStore(FileStore):
    """An S3-compatible bucket or an Azure container, through ``obstore``: ``If-None-Match: *`` for a
    create, ``If-Match`` with the ETag read for a replace. The server must support both (AWS S3 does
    since 2024, MinIO and versitygw do; Azure Blob Storage and its emulator Azurite do)."""

    remote = True

    def __init__(self, root: str, options: Mapping[str, str]):
        parsed = urlparse(root)
        if not parsed.netloc:
            raise InvalidArgumentError(f"an object-storage location names a bucket or container: s3://BUCKET/PREFIX, "
                                       f"abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX; got {root!r}")
        self.root = root
        self._policy = RetryPolicy.of(options)
        config = {key: value for key, value in options.items()
                  if key not in ALLOW_HTTP_SETTINGS and key not in RETRY_SETTINGS}
        allow_http = [_truthy(options[key]) for key in ALLOW_HTTP_SETTINGS if key in options]
        client = {"allow_http": any(allow_http)} if allow_http else None
        # object_store's own retries are off: coordinator.retries makes them, counted and logged, and
        # tells a conditional write whose reply was lost from one refused (see create and replace).
        retry = {"max_retries": 0}
        if parsed.scheme in S3_SCHEMES:
            self._store = S3Store(parsed.netloc, prefix=parsed.path.strip("/") or None, config=config or None,
                                  client_options=client, retry_config=retry)
        else:
            # obstore's Azure store takes only azure_* keys (it aborts the process on others, a Rust panic);
            # the account and container come from the URL as delta-rs reads it.
            foreign = sorted(key for key in config if not key.lower().startswith("azure_"))
            if foreign:
                raise InvalidArgumentError(f"{root}: [storage] settings for Azure are object_store's azure_* keys "
                                           f"(and allow_http, max_retries, retry_timeout); not {', '.join(foreign)}")
            self._store = AzureStore.from_url(root, config=config or None, client_options=client, retry_config=retry)

    def location(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{key}"

    @_naming_denied_paths
    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[Versioned]:
        def attempt() -> Optional[Versioned]:
            try:
                result = obstore.get(self._store, key)
                # Before the body: the reply's headers give its size.
                _check_size(key, result.meta["size"], max_bytes, _milliseconds(result.meta["last_modified"]))
                data = bytes(result.bytes())  # the body is read here: its failures are retried too
            except FileNotFoundError:
                return None
            return Versioned(data, result.meta["e_tag"], _milliseconds(result.meta["last_modified"]))

        return self._retrying("read", key, attempt)

    @_naming_denied_paths
    def read_range(self, key: str, start: int, end: int) -> Optional[bytes]:
        def attempt() -> Optional[bytes]:
            try:
                return bytes(obstore.get_range(self._store, key, start=start, end=end))
            except FileNotFoundError:
                return None

        return self._retrying("read", key, attempt)

    @_naming_denied_paths
    def exists(self, key: str) -> bool:
        def attempt() -> bool:
            try:
                obstore.head(self._store, key)
            except FileNotFoundError:
                return False
            return True

        return self._retrying("exists", key, attempt)

    @_naming_denied_paths
    def create(self, key: str, data: bytes) -> Optional[str]:
        return self._conditional_put("create", key, data, "create", (AlreadyExistsError, PreconditionError))

    @_naming_denied_paths
    def replace(self, key: str, data: bytes, version: str) -> Optional[str]:
        return self._conditional_put("replace", key, data, {"e_tag": version}, (PreconditionError, FileNotFoundError))

    @_naming_denied_paths
    def put(self, key: str, data: bytes) -> int:
        self._retrying("put", key, lambda: obstore.put(self._store, key, data))
        return int(time.time() * 1000)

    @_naming_denied_paths
    def delete(self, key: str) -> None:
        def attempt() -> None:
            try:
                obstore.delete(self._store, key)
            except FileNotFoundError:
                pass

        self._retrying("delete", key, attempt)

    @_naming_denied_paths
    def list(self, prefix: str) -> list[str]:
        prefix = prefix.rstrip("/") + "/"
        return self._retrying("list", prefix, lambda: sorted(
            meta["path"] for batch in obstore.list(self._store, prefix) for meta in batch
            if "/" not in meta["path"][len(prefix):]))

    @_naming_denied_paths
    def list_after(self, prefix: str, after: str, max_keys: int) -> Optional[list[str]]:
        if not isinstance(self._store, S3Store):
            return None
        prefix = prefix.rstrip("/") + "/"

        def attempt() -> list[str]:
            keys = []
            for batch in obstore.list(self._store, prefix, offset=after, chunk_size=min(max(max_keys, 1), 1000)):
                keys.extend(meta["path"] for meta in batch if "/" not in meta["path"][len(prefix):])
                if len(keys) >= max_keys:
                    break
            return keys[:max_keys]

        return self._retrying("list", prefix, attempt)

    @_naming_denied_paths
    def modified(self, prefix: str) -> dict[str, int]:
        listed = self._retrying("list", prefix, lambda: obstore.list_with_delimiter(self._store, prefix.rstrip("/") + "/"))
        return {meta["path"]: _milliseconds(meta["last_modified"]) for meta in listed["objects"]}

    @_naming_denied_paths
    def listing(self, prefix: str) -> "Listing":
        listed = self._retrying("list", prefix, lambda: obstore.list_with_delimiter(self._store, prefix.rstrip("/") + "/"))
        return Listing(sorted(common.rstrip("/").rsplit("/", 1)[-1] for common in listed["common_prefixes"]),
                       {meta["path"].rsplit("/", 1)[-1]: meta.get("e_tag") or f"{meta['last_modified']}-{meta['size']}"
                        for meta in listed["objects"]})

    def _retrying(self, operation: str, key: str, attempt: Callable[[], _T], conditional_write: bool = False) -> _T:
        return retrying(self._policy, operation, self.location(key), attempt, conditional_write)

    def _conditional_put(self, operation: str, key: str, data: bytes, mode, refused: tuple[type, ...]) -> Optional[str]:
        """``data`` put at ``key`` under ``mode`` (obstore's), retried; its ETag, or ``None`` if the storage
        refused it with one of ``refused`` and, after a second attempt, the file is not this writer's."""
        attempts = 0

        def attempt() -> Optional[str]:
            nonlocal attempts
            attempts += 1
            try:
                return obstore.put(self._store, key, data, mode=mode)["e_tag"]
            except refused:
                return None

        written = self._retrying(operation, key, attempt, conditional_write=True)
        return self._own_write(operation, key, data) if written is None and attempts > 1 else written

    def _own_write(self, operation: str, key: str, data: bytes) -> Optional[str]:
        """After a conditional write was refused on a second attempt: the file's version if it holds
        exactly ``data`` (the first attempt was made, its reply lost), else ``None`` (another writer's).

        Exact because every caller's content is its own: a Delta commit names a data file by UUID, a
        lease or progress record its holder and time.
        """
        current = self.read(key)
        if current is None or current.data != data:
            return None
        note_own_write_recognised(operation, self.location(key))
        return current.version


def _check_size(key: str, size: int, max_bytes: Optional[int], modified_ms: int) -> None:
    if max_bytes is not None and size > max_bytes:
        raise FileTooLargeError(f"{key} is {size} bytes; at most {max_bytes} are read", modified_ms)


def _milliseconds(when: dt.datetime) -> int:
    # An HTTP date has whole seconds: round up, so that a time read here is never before the write.
    millis = int(when.timestamp() * 1000)
    return millis + 999 if when.microsecond == 0 else millis


def _truthy(value: str) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")
