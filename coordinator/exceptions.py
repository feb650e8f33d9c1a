"""Every error the coordinator raises. All derive from :class:`CoordinatorError`, and each says what a
caller may do about it in two attributes (docs/producer.md#errors):

- ``retriable``: the same call, made again as it was, may succeed (the cause passes: the storage
  throttled, failed or timed out); otherwise it fails the same way until something is changed;
- ``outcome_unknown``: what the call was to write may or may not have been written, so the caller
  must assume neither (:class:`HalfOutcomeUnknownError`, :class:`WriteOutcomeUnknownError`).

Each class sets both; an error whose cause decides sets ``retriable`` for itself
(:class:`HalfNotStoredError`: a storage that failed for a while, yes; one that refused, no).

Example::

    try:
        producer.send_message_in_transaction(msg, order)
    except CoordinatorError as error:
        if error.outcome_unknown: ...  # look it up (``error.transaction_id``) before saying either way
        elif error.retriable: ...      # send again, later
"""

__all__ = ["AccessDeniedError", "CaseFailedError", "CheckerAlreadyRunningError", "CheckerStateError", "CheckpointMismatchError",
           "ConfigError", "ConformanceKitError", "ConsumerStateError", "CoordinatorError", "CorruptInputError", "FileTooLargeError",
           "HalfNotStoredError", "HalfOutcomeUnknownError", "IncompleteListenerError", "InvalidArgumentError",
           "LakehouseNotFoundError", "LeaseLostError", "MessageValidationError", "OutdatedLakehouseError",
           "PositionGoneError", "ProducerStateError", "SparkSetupError", "StopRequested", "StorageUnavailableError",
           "UnsupportedTableError", "WriteOutcomeUnknownError", "one_line"]


class CoordinatorError(Exception):
    """Base class of every error raised by the coordinator."""

    #: Whether the same call, made again as it was, may succeed.
    retriable: bool = False
    #: Whether what the call was to write may or may not have been written.
    outcome_unknown: bool = False


class ConfigError(CoordinatorError, ValueError):
    """A configuration file or ``TXCOORD_*`` variable holds a bad value."""


class InvalidArgumentError(CoordinatorError, ValueError):
    """A function of the API was called with a value outside what it accepts; nothing was done."""


class MessageValidationError(CoordinatorError, ValueError):
    """A message was refused at the producer: bad topic, body or property.

    Nothing was written; the local transaction was not run.
    """


class IncompleteListenerError(CoordinatorError, TypeError):
    """A :class:`~coordinator.producer.listener.TransactionListener` subclass was created without
    implementing both of its methods."""


class HalfNotStoredError(CoordinatorError):
    """The half message could not be made durable in the commit log.

    The local transaction was not run; the send counts as ``ROLLBACK_MESSAGE``. ``retriable`` is its
    cause's: true when the storage failed for a while (:class:`StorageUnavailableError`), false when it
    refused (:class:`AccessDeniedError`) or the commit log is not a table this producer can append to.
    """

    def __init__(self, message: str, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class HalfOutcomeUnknownError(CoordinatorError):
    """The storage did not say whether the half message was stored (it failed, or its reply was
    lost, on every attempt for the bounded retry time).

    The local transaction was not run. If the half was stored, the checker will check back once its
    immunity is over: the listener's ``check_local_transaction`` then answers for a local
    transaction that never ran (roll back). ``transaction_id`` says which transaction to look for
    (``txcoord inspect``). Retriable: a new send is a new transaction, and this one, if stored, is
    rolled back.
    """

    retriable = True
    outcome_unknown = True

    def __init__(self, message: str, transaction_id: str) -> None:
        super().__init__(message)
        self.transaction_id = transaction_id


class ProducerStateError(CoordinatorError):
    """The producer was used before ``start()`` or after ``shutdown()``."""


class ConsumerStateError(CoordinatorError):
    """A consumer was started again after ``close()``, or an operator acted on a consumer group whose
    instances are live where it must be stopped (``txcoord consumer-groups reset``)."""


class PositionGoneError(CoordinatorError):
    """A consumer group's position in a topic is a version the topic's log no longer holds (log cleanup,
    vacuum): its messages cannot be read. ``txcoord consumer-groups reset`` moves the group on."""


class LakehouseNotFoundError(CoordinatorError):
    """The directory holds no lakehouse (``txcoord init`` creates one)."""


class OutdatedLakehouseError(CoordinatorError):
    """A table lacks a column this version reads: an older txcoord made it. ``txcoord init``, or
    starting the checker or a producer, adds the column."""


class AccessDeniedError(CoordinatorError, PermissionError):
    """The storage refused this principal's request for a path (its grants do not cover it; see
    ``txcoord grants``). Nothing was written."""


class CorruptInputError(CoordinatorError, ValueError):
    """What a writer put in its own prefix is not what it must be (a Delta commit of one JSON object a
    line, a data file of commit-log records, a producer instance's record): it is refused, for its
    writer alone, with this message as the reason."""


class FileTooLargeError(CoordinatorError, ValueError):
    """A file is larger than what may be read of it (``FileStore.read``'s ``max_bytes``): refused
    before its content is read. ``modified_ms``: when it was last written (epoch milliseconds)."""

    def __init__(self, message: str, modified_ms: int = 0):
        super().__init__(message)
        self.modified_ms = modified_ms


class StorageUnavailableError(CoordinatorError):
    """The storage failed a request on every attempt (throttling, server errors, timeouts, lost
    connections) until the retries' bound (the ``[storage]`` settings ``max_retries`` and
    ``retry_timeout``) ran out. A write it names may have happened or not (see
    :class:`WriteOutcomeUnknownError`); nothing else was done. Retriable."""

    retriable = True


class WriteOutcomeUnknownError(StorageUnavailableError):
    """A conditional write (a Delta commit, the lease, the progress record) whose outcome the
    storage never told: it may have been made. Whoever reads the file next learns which. Retriable, as
    its base class: the storage may answer the next time; but read the file before writing again, or
    what was written may be written twice."""

    outcome_unknown = True


class SparkSetupError(CoordinatorError):
    """Spark or the Delta jars are not set up: run ``make setup``."""


class CheckerAlreadyRunningError(CoordinatorError):
    """Another checker holds this lakehouse's lease and is alive: only one may run."""


class LeaseLostError(CoordinatorError):
    """This checker's lease was taken over (it stalled past the lease's expiry): it must stop."""


class CheckpointMismatchError(CoordinatorError):
    """The checker's streaming checkpoint is missing, foreign or older than what the lakehouse
    records; starting anyway would re-deliver or drop messages. The message says how to recover."""


class UnsupportedTableError(CoordinatorError):
    """A Delta table asks more of a writer than this coordinator's appends do (a writer feature,
    a constraint, a changed schema); nothing was written to it."""


class CheckerStateError(CoordinatorError, RuntimeError):
    """The checker's memory disagrees with its own tables: a bug, reported instead of writing on."""


class StopRequested(CoordinatorError):
    """Raised inside a Spark job's batch that starts after stop was asked: it is neither processed
    nor committed, so the next run of the query replays it."""


class ConformanceKitError(CoordinatorError):
    """``txcoord conformance`` cannot run (its checker did not start, a case it does not have, no S3 server):
    no case was judged."""


class CaseFailedError(CoordinatorError):
    """A case of the conformance kit failed: the client under test or the checker's tables disagree with the
    client protocol; the message says how, as the case's ``FAIL`` line prints it."""


def one_line(error: BaseException, limit: int = 300) -> str:
    """``error`` as one line for a report or a table's ``reason``: its class and its message's first line,
    cut at ``limit`` characters (a storage error's message can run to pages).

    Example::

        one_line(FileNotFoundError("no such file\n..."))  # 'FileNotFoundError: no such file'
    """
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:limit]}" if lines else type(error).__name__
