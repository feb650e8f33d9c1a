"""Every error the coordinator raises. All derive from :class:`CoordinatorError`."""


class CoordinatorError(Exception):
    """Base class of every error raised by the coordinator."""


class ConfigError(CoordinatorError, ValueError):
    """A configuration file or ``TXCOORD_*`` variable holds a bad value."""


class MessageValidationError(CoordinatorError, ValueError):
    """A message was refused at the producer: bad topic, body or property.

    Nothing was written; the local transaction was not run.
    """


class HalfNotStoredError(CoordinatorError):
    """The half message could not be made durable in the commit log.

    The local transaction was not run; the send counts as ``ROLLBACK_MESSAGE``.
    """


class ProducerStateError(CoordinatorError):
    """The producer was used before ``start()`` or after ``shutdown()``."""


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
