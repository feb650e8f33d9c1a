"""Bounded retries of object-storage requests, each one logged and counted.

Object storage throttles (503 SlowDown), fails (500), stalls and drops connections, sometimes
after it has done what it was asked. Every request txcoord itself makes to a bucket (the small
files and the Delta commits of :mod:`coordinator.storage`) goes through :func:`retrying`:
exponential backoff with jitter (``stamina``), at most ``max_retries`` retries and
``retry_timeout`` in all, then :class:`~coordinator.exceptions.StorageUnavailableError`. Those two
are ``[storage]`` settings that delta-rs reads too, so its own reads are bounded alike
(object_store retries them itself, uncounted).

What happened is counted in this process (:func:`storage_request_counts`, which the checker
serves as ``txcoord_storage_*`` metrics) and logged: each retry with its cause, each request that
ran out of retries, and each conditional write found already made by this writer, its reply
having been lost (:func:`note_own_write_recognised`; :mod:`coordinator.storage` tells). Delta commits
refused because another writer made that version first are counted too
(:func:`note_commit_race_lost`; :mod:`coordinator.appender` tells, and logs them).

Example::

    policy = RetryPolicy.of({"max_retries": "5", "retry_timeout": "30s"})
    etag = retrying(policy, "create", "s3://b/lh/_delta_log/00000000000000000042.json", lambda: put(...))
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, TypeVar

from obstore.exceptions import GenericError, JoinError

from coordinator.durations import parse_duration
from coordinator.exceptions import ConfigError, InvalidArgumentError, StorageUnavailableError, WriteOutcomeUnknownError

__all__ = ["RETRY_SETTINGS", "RetryPolicy", "StorageRequestCounts", "note_commit_race_lost", "note_own_write_recognised",
           "retrying", "storage_request_counts"]

_log = logging.getLogger("coordinator.storage")

#: The ``[storage]`` settings that bound retries, named as delta-rs (object_store) names them.
RETRY_SETTINGS = ("max_retries", "retry_timeout")
DEFAULT_MAX_RETRIES = 10
DEFAULT_RETRY_TIMEOUT_S = 60.0
#: The causes a retry is counted under, from what the storage or the connection said.
THROTTLED, SERVER_ERROR, TIMEOUT, CONNECTION, OTHER = "throttled", "server_error", "timeout", "connection", "other"

_T = TypeVar("_T")
_S3_CODE = re.compile(r"<Code>(\w+)</Code>")
_STATUS = re.compile(r"status code: ([1-5][0-9]{2})\b|\bstatus: ([1-5][0-9]{2}),")


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and for how long in all, a failed storage request is tried again.

    Example::

        RetryPolicy.of({"retry_timeout": "2m"})  # RetryPolicy(max_retries=10, timeout_s=120.0)
    """

    max_retries: int = DEFAULT_MAX_RETRIES
    timeout_s: float = DEFAULT_RETRY_TIMEOUT_S

    @classmethod
    def of(cls, storage: Mapping[str, str]) -> "RetryPolicy":
        """The policy the ``[storage]`` settings ``storage`` ask for (defaults for those absent);
        raises :class:`~coordinator.exceptions.ConfigError` for a bad value."""
        max_retries, timeout = storage.get("max_retries"), storage.get("retry_timeout")
        try:
            retries = DEFAULT_MAX_RETRIES if max_retries is None else int(max_retries)
        except ValueError:
            raise ConfigError(f"[storage] max_retries must be a whole number, got {max_retries!r}") from None
        try:
            timeout_s = DEFAULT_RETRY_TIMEOUT_S if timeout is None else parse_duration(timeout)
        except InvalidArgumentError as error:
            raise ConfigError(f"[storage] retry_timeout: {error}") from None
        if retries < 0 or timeout_s <= 0:
            raise ConfigError(f"[storage] max_retries must be at least 0 and retry_timeout more than 0, got "
                              f"{max_retries!r} and {timeout!r}")
        return cls(retries, timeout_s)


def retrying(policy: RetryPolicy, operation: str, location: str, call: Callable[[], _T],
             conditional_write: bool = False) -> _T:
    """``call()``, tried again on what object storage may fail for a while, as ``policy`` bounds it.

    Once the bound is reached, raises :class:`~coordinator.exceptions.StorageUnavailableError`
    naming ``operation``, ``location``, the attempts and the last error, or, for a
    ``conditional_write`` (whose outcome nobody can know then), its subclass
    :class:`~coordinator.exceptions.WriteOutcomeUnknownError`. Any other error at once.

    Example::

        data = retrying(policy, "read", location, lambda: obstore.get(store, key).bytes())
    """
    # Imported at the first request, not with this module: stamina and tenacity cost each of Spark's Python
    # workers for the checker's source at start-up (they import coordinator, touch no storage).
    import stamina

    started = time.monotonic()
    previous: Optional[BaseException] = None
    attempts = 0
    try:
        for attempt in stamina.retry_context(on=_retried, attempts=policy.max_retries + 1, timeout=policy.timeout_s,
                                             wait_initial=0.05, wait_max=5.0, wait_jitter=0.5):
            with attempt:
                attempts = attempt.num
                if previous is not None:
                    _note_retry(operation, location, previous, attempt.num)
                try:
                    return call()
                except Exception as error:
                    previous = error
                    raise
    except Exception as error:
        if _cause(error) is None:
            raise
        _count(("exhausted", operation, _cause(error)))
        message = (f"{location}: {operation} failed {attempts} time(s) in {time.monotonic() - started:.1f} s "
                   f"(the bound is {policy.max_retries} retries and {policy.timeout_s:g} s: the [storage] settings "
                   f"max_retries and retry_timeout); last: {_first_line(error)}")
        _log.error("%s", message)
        if conditional_write:
            raise WriteOutcomeUnknownError(message) from error
        raise StorageUnavailableError(message) from error


def note_own_write_recognised(operation: str, location: str) -> None:
    """Count and log a conditional write refused because the file already held exactly what this
    writer wrote: an earlier attempt of it succeeded and its reply was lost."""
    _count(("own_write", operation, ""))
    _log.warning("%s: %s found already made by this writer (an earlier attempt's reply was lost); taken as done",
                 location, operation)


def note_commit_race_lost() -> None:
    """Count a Delta commit refused because another writer had made that version first (a lost race,
    tried again at the next version; the caller logs it)."""
    _count(("commit_race_lost", "", ""))


@dataclass(frozen=True)
class StorageRequestCounts:
    """This process's storage requests that did not go straight through, since it started:
    ``retries`` by (operation, cause), ``exhausted`` (ran out of retries) by (operation, cause),
    ``own_writes_recognised`` by operation, and ``commit_races_lost``: Delta commits refused because
    another writer made that version first."""

    retries: dict[tuple[str, str], int]
    exhausted: dict[tuple[str, str], int]
    own_writes_recognised: dict[str, int]
    commit_races_lost: int = 0


def storage_request_counts() -> StorageRequestCounts:
    """What :class:`StorageRequestCounts` says, now.

    Example::

        storage_request_counts().retries  # {("create", "throttled"): 3, ("read", "connection"): 1}
        storage_request_counts().commit_races_lost  # 12
    """
    with _lock:
        counts = dict(_counts)
    return StorageRequestCounts(
        retries={(op, cause): n for (kind, op, cause), n in counts.items() if kind == "retry"},
        exhausted={(op, cause): n for (kind, op, cause), n in counts.items() if kind == "exhausted"},
        own_writes_recognised={op: n for (kind, op, _), n in counts.items() if kind == "own_write"},
        commit_races_lost=counts.get(("commit_race_lost", "", ""), 0))


_lock = threading.Lock()
_counts: Counter = Counter()


def _count(key: tuple[str, str, str]) -> None:
    with _lock:
        _counts[key] += 1


def _note_retry(operation: str, location: str, error: BaseException, attempt: int) -> None:
    cause = _cause(error) or OTHER
    _count(("retry", operation, cause))
    _log.warning("%s: %s retried (attempt %d) after %s: %s", location, operation, attempt, cause, _first_line(error))


def _retried(error: Exception) -> bool:
    return _cause(error) is not None


def _cause(error: BaseException) -> Optional[str]:
    """Why ``error`` is worth trying again, or ``None`` if it is not (refused, missing, a precondition, a
    bad request: the same request would fail the same way).

    obstore raises every transport and server failure as a ``GenericError`` whose text carries the
    HTTP status (``status code: 503``), or the transport's own error, then a debug dump (which
    holds numbers such as ``elapsed: 503.1µs`` and the word ``retry_timeout``: hence the exact forms).
    delta-rs raises the same failures as an ``OSError`` in the same words ("Generic S3 error: ..."), and
    also a local disk's, which are only retried when those words name a transport failure.
    """
    if isinstance(error, JoinError):
        return OTHER
    from_delta_rs = type(error) is OSError and str(error).startswith("Generic ")
    if not (isinstance(error, GenericError) or from_delta_rs):
        return None
    text = str(error)
    status = _STATUS.search(text)
    if status is not None:
        code = int(status.group(1) or status.group(2))
        if code in (429, 503) or "<Code>SlowDown</Code>" in text:
            return THROTTLED
        if code >= 500:
            return SERVER_ERROR
        return TIMEOUT if code == 408 else None
    lowered = text.lower()
    if "timed out" in lowered or "timedout" in lowered:
        return TIMEOUT
    if any(mark in lowered for mark in ("error sending request", "connection", "incompletemessage", "broken pipe")):
        return CONNECTION
    return None if from_delta_rs else OTHER


def _first_line(error: BaseException) -> str:
    """The error's class and first line, with the S3 error code the body names (obstore puts it on the next)."""
    text = str(error).strip()
    line = text.splitlines()[0].split(" <?xml", 1)[0].rstrip(": ") if text else ""
    code = _S3_CODE.search(text)
    return f"{type(error).__name__}: {line}" + (f" ({code.group(1)})" if code else "")
