"""Transactional messages on Delta Lake, coordinated by Spark Structured Streaming.

The producer side (this package's top level) needs no JVM::

    from coordinator import (CoordinatorConfig, LocalTransactionState, Message,
                             TransactionListener, TransactionProducer)
"""

from coordinator.config import CoordinatorConfig
from coordinator.listener import LocalTransactionState, TransactionListener
from coordinator.message import Message, SendStatus, TransactionSendResult

# The checker imports the vocabulary from this package too; loading the producer
# (and delta-rs) only when asked for keeps the two sides apart.
def __getattr__(name: str):
    if name == "TransactionProducer":
        from coordinator.producer import TransactionProducer

        return TransactionProducer
    raise AttributeError(f"module 'coordinator' has no attribute {name!r}")


__all__ = [
    "CoordinatorConfig",
    "LocalTransactionState",
    "Message",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]
