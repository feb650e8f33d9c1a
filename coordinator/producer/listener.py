"""What a producer group implements: the listener that runs local transactions and answers check-backs."""

from __future__ import annotations

from typing import Any

from coordinator.exceptions import IncompleteListenerError
from coordinator.producer.message import Message
from coordinator.protocol import LocalTransactionState

__all__ = ["TransactionListener"]

_REQUIRED = ("execute_local_transaction", "check_local_transaction")


class TransactionListener:
    """What a producer group implements: run its local transaction, and answer check-backs.

    Both methods must be implemented: a listener missing either fails when it is created
    (:class:`~coordinator.exceptions.IncompleteListenerError`), not at the first check-back.

    Example::

        class OrderListener(TransactionListener):
            def execute_local_transaction(self, msg, arg):
                db.insert_order(arg)
                return LocalTransactionState.COMMIT_MESSAGE

            def check_local_transaction(self, msg):
                found = db.order_exists(msg.keys)
                return LocalTransactionState.COMMIT_MESSAGE if found else LocalTransactionState.ROLLBACK_MESSAGE
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        missing = [name for name in _REQUIRED if getattr(cls, name) is getattr(TransactionListener, name)]
        if missing:
            raise IncompleteListenerError(f"{cls.__name__} must implement {' and '.join(missing)}")
        return super().__new__(cls)

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
