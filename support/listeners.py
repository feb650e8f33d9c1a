"""Local transactions for producers whose own business is not what is tested or measured."""

from __future__ import annotations

__all__ = ["Commits"]


class Commits:
    """A no-op local transaction that commits (so the coordinator's own cost is what is measured). Its class
    is made when called: importing :mod:`support` loads nothing of the product."""

    def __new__(cls):
        from coordinator import LocalTransactionState, TransactionListener

        class _Commits(TransactionListener):
            def execute_local_transaction(self, msg, arg):
                return LocalTransactionState.COMMIT_MESSAGE

            def check_local_transaction(self, msg):
                return LocalTransactionState.COMMIT_MESSAGE

        return _Commits()


