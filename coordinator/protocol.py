"""The protocol's words, defined once for both sides: record kinds, local-transaction states,
outcomes, and the limits every message is held to.

Producers (no JVM) write these words into the commit log; the checker (Spark) reads them back
and judges every record by the same rules, so a record that bypassed the producer API is
refused exactly as the API would have refused it.

Example::

    from coordinator.protocol import LocalTransactionState, Outcome, RecordKind, outcome_of
    RecordKind.HALF                                      # 'HALF', the kind of a prepared message
    outcome_of(LocalTransactionState.COMMIT_MESSAGE)     # Outcome.COMMIT
"""

from __future__ import annotations

import enum
import re
from typing import Any, Optional

from coordinator.exceptions import MessageValidationError

__all__ = ["CHECK_IMMUNITY_TIME_IN_SECONDS", "DELAY_PROPERTIES", "IMMUNITY_DIGITS", "LocalTransactionState",
           "MAX_BODY_BYTES", "MAX_IMMUNITY_SECONDS", "MAX_REASON_LENGTH", "OPERATOR_CHECK_PREFIX", "OPERATOR_PROPERTY",
           "OPERATOR_REASON_PROPERTY", "Outcome", "RecordKind", "TOPIC_CHARACTERS", "TOPIC_MAX_LENGTH", "TOPIC_PATTERN",
           "outcome_of", "parse_immunity_seconds", "validate_topic"]


class RecordKind(enum.StrEnum):
    """What a commit-log record is: a prepared message, or the end of a local transaction."""

    HALF = "HALF"
    END = "END"


class LocalTransactionState(enum.Enum):
    """Outcome of a local transaction, as reported in an END record.

    ``UNKNOW`` keeps RocketMQ's spelling; ``UNKNOWN`` is an alias of it.

    Example::

        LocalTransactionState.UNKNOWN is LocalTransactionState.UNKNOW  # True
    """

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"
    UNKNOWN = "UNKNOW"

    @classmethod
    def coerce(cls, value: Any) -> "LocalTransactionState":
        """Read a listener's return value: ``None`` and anything unknown count as ``UNKNOW``.

        Example::

            LocalTransactionState.coerce("COMMIT_MESSAGE")  # COMMIT_MESSAGE
            LocalTransactionState.coerce(None)              # UNKNOW
        """
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOW


class Outcome(enum.StrEnum):
    """How a transaction ended, as recorded in ``system/op``."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    #: Given up by the checker: checked the maximum number of times, or past retention.
    DISCARD = "DISCARD"


def outcome_of(state: LocalTransactionState | str) -> Optional[Outcome]:
    """The outcome an END with ``state`` decides; ``None`` for ``UNKNOW`` (it decides nothing).

    Example::

        outcome_of("ROLLBACK_MESSAGE")  # Outcome.ROLLBACK
        outcome_of("UNKNOW")            # None
    """
    return _OUTCOME_OF_STATE.get(state.value if isinstance(state, LocalTransactionState) else state)


_OUTCOME_OF_STATE = {LocalTransactionState.COMMIT_MESSAGE.value: Outcome.COMMIT,
                     LocalTransactionState.ROLLBACK_MESSAGE.value: Outcome.ROLLBACK}


#: An operator's END (``txcoord resolve``) answers a check of this id prefix, so the checker judges
#: it as a check answer, at any time; its properties name the operator and the reason.
OPERATOR_CHECK_PREFIX = "operator-"
OPERATOR_PROPERTY = "TXCOORD_OPERATOR"
OPERATOR_REASON_PROPERTY = "TXCOORD_OPERATOR_REASON"
#: Longest reason an operator may give.
MAX_REASON_LENGTH = 1000

#: Property that replaces the default immunity (``transaction_timeout_ms``) for one message.
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"

#: Delay properties: not supported on transactional messages, cleared as RocketMQ does.
DELAY_PROPERTIES = ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")

TOPIC_CHARACTERS = "%|a-zA-Z0-9_-"
#: RocketMQ's topic rule. Matched against the whole name: a trailing newline, which ``$``
#: lets through in both Python's and Java's regex engines, is refused too.
TOPIC_PATTERN = rf"^[{TOPIC_CHARACTERS}]+$"
TOPIC_MAX_LENGTH = 127
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Upper bound of a per-message immunity: one week, far beyond any sane local transaction.
MAX_IMMUNITY_SECONDS = 7 * 24 * 3600

_TOPIC_RE = re.compile(rf"[{TOPIC_CHARACTERS}]+")
#: A per-message immunity, in seconds; the checker applies the same pattern.
IMMUNITY_DIGITS = "[0-9]{1,9}"
_IMMUNITY_RE = re.compile(IMMUNITY_DIGITS)


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid topic name, else raise :class:`MessageValidationError`.

    Example::

        validate_topic("ORDER_TOPIC")  # 'ORDER_TOPIC'
        validate_topic("../x")         # raises MessageValidationError
    """
    if not isinstance(topic, str) or not topic:
        raise MessageValidationError(f"topic must be a non-empty string, got {topic!r}")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise MessageValidationError(f"topic is {len(topic)} characters long; the maximum is {TOPIC_MAX_LENGTH}")
    if not _TOPIC_RE.fullmatch(topic):
        raise MessageValidationError(f"topic {topic!r} does not match {TOPIC_PATTERN}")
    return topic


def parse_immunity_seconds(value: object) -> Optional[int]:
    """Read a ``CHECK_IMMUNITY_TIME_IN_SECONDS`` value: ``None`` if absent, else a positive int.

    Example::

        parse_immunity_seconds("10")  # 10
        parse_immunity_seconds("-1")  # raises MessageValidationError
    """
    if value is None:
        return None
    text = str(value)
    # ASCII digits only, nothing around them: exactly what the checker's own rule accepts.
    if not _IMMUNITY_RE.fullmatch(text) or not 0 < int(text) <= MAX_IMMUNITY_SECONDS:
        raise MessageValidationError(
            f"{CHECK_IMMUNITY_TIME_IN_SECONDS} must be a whole number of seconds in 1..{MAX_IMMUNITY_SECONDS}, got {value!r}"
        )
    return int(text)
