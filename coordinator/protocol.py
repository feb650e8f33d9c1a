"""The protocol's words, defined once for both sides: its version, record kinds, local-transaction states,
outcomes and the properties the protocol reads.

Producers (no JVM) write these words into the commit log; the checker (Spark) reads them back.
The limits every message is held to are :mod:`coordinator.validation`'s.

Example::

    from coordinator.protocol import LocalTransactionState, Outcome, RecordKind, outcome_of
    RecordKind.HALF                                      # 'HALF', the kind of a prepared message
    outcome_of(LocalTransactionState.COMMIT_MESSAGE)     # Outcome.COMMIT
"""

from __future__ import annotations

import enum
import json
from typing import Any, Mapping, Optional

__all__ = ["CHECK_IMMUNITY_TIME_IN_SECONDS", "DELAY_PROPERTIES", "KNOWN_PROTOCOLS", "LocalTransactionState",
           "MAX_COMMIT_BODY_BYTES", "MAX_REASON_LENGTH", "OPERATOR_CHECK_PREFIX", "OPERATOR_PROPERTY",
           "OPERATOR_REASON_PROPERTY", "Outcome", "PROTOCOL", "PROTOCOL_FIELD", "RecordKind", "is_operators_check",
           "outcome_of", "protocol_refusal"]

#: The client protocol this code writes (docs/protocol.md#versioning), and the field of each commit's ``commitInfo``
#: action that says it: every commit a client makes to its commit log names the protocol it was written under.
PROTOCOL = 1
PROTOCOL_FIELD = "txcoordProtocol"
#: The protocols the checker reads. A commit that names none was written under protocol 1 (before the field, or by
#: maintenance and the operators' tools, which write no client's records).
KNOWN_PROTOCOLS = frozenset({1})


def protocol_refusal(commit_info: Any) -> Optional[str]:
    """Why a commit whose ``commitInfo`` action is ``commit_info`` (``None``: it has none) cannot be read under a
    protocol the checker knows, or ``None`` if it can. The number is a JSON integer: ``"1"`` or ``true`` is none
    (named as the commit spells it).

    Example::

        protocol_refusal({"txcoordProtocol": 2})    # 'unsupported client protocol 2: this checker reads protocol 1'
        protocol_refusal({"txcoordProtocol": "1"})  # 'unsupported client protocol "1": this checker reads ...'
        protocol_refusal({"engineInfo": "x"})       # None: protocol 1
    """
    declared = commit_info.get(PROTOCOL_FIELD, PROTOCOL) if isinstance(commit_info, Mapping) else PROTOCOL
    if type(declared) is int and declared in KNOWN_PROTOCOLS:
        return None
    known = ", ".join(str(version) for version in sorted(KNOWN_PROTOCOLS))
    return f"unsupported client protocol {json.dumps(declared)[:64]}: this checker reads protocol {known}"

#: The bodies of one transaction's messages together, and of one commit-log commit: the checker reads no
#: data file that could not come from a commit within it (:mod:`coordinator.checker.segment`).
MAX_COMMIT_BODY_BYTES = 64 * 1024 * 1024


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


def is_operators_check(check_id: Optional[str]) -> bool:
    """Whether an END with ``check_id`` is an operator's decision (``txcoord resolve``); the checker asks the
    same of a batch's columns with :func:`coordinator.checker.provenance.operators_decisions`.

    Example::

        is_operators_check("operator-3f2a")  # True
    """
    return (check_id or "").startswith(OPERATOR_CHECK_PREFIX)


OPERATOR_PROPERTY = "TXCOORD_OPERATOR"
OPERATOR_REASON_PROPERTY = "TXCOORD_OPERATOR_REASON"
#: Longest reason an operator may give.
MAX_REASON_LENGTH = 1000

#: Property that replaces the default immunity (``transaction_timeout_ms``) for one message.
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"

#: Delay properties: not supported on transactional messages, cleared as RocketMQ does.
DELAY_PROPERTIES = ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
