"""Transactional messages on Delta Lake, coordinated by Spark Structured Streaming.

The producer side (this package's top level) needs no JVM::

    from coordinator import (CoordinatorConfig, LocalTransactionState, Message,
                             TransactionListener, TransactionProducer)
"""

from coordinator.config import CoordinatorConfig
from coordinator.listener import LocalTransactionState, TransactionListener
from coordinator.message import Message, SendStatus, TransactionSendResult
from coordinator.producer import TransactionProducer

__all__ = [
    "CoordinatorConfig",
    "LocalTransactionState",
    "Message",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]
