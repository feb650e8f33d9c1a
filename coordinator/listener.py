"""The local-transaction side of the protocol: states and the listener interface."""

from __future__ import annotations

import enum
from typing import Any

from coordinator.message import Message


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


class TransactionListener:
    """What a producer group implements: run its local transaction, and answer check-backs.

    Example::

        class OrderListener(TransactionListener):
            def execute_local_transaction(self, msg, arg):
                db.insert_order(arg)
                return LocalTransactionState.COMMIT_MESSAGE

            def check_local_transaction(self, msg):
                found = db.order_exists(msg.keys)
                return LocalTransactionState.COMMIT_MESSAGE if found else LocalTransactionState.ROLLBACK_MESSAGE
    """

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """Run the local transaction once the half is durable.

        Return its outcome. An exception or ``None`` counts as ``UNKNOW``: the
        coordinator will ask :meth:`check_local_transaction` later.
        """
        raise NotImplementedError

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        """Say what became of the local transaction of ``msg`` (a check-back).

        ``msg`` carries ``topic``, ``body``, ``keys``, ``tags``, ``properties``
        and ``transaction_id``. ``UNKNOW`` means "ask again later".
        """
        raise NotImplementedError
