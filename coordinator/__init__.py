"""Transactional messages on Delta Lake, coordinated by Spark Structured Streaming.

What a producer and a consumer need, importable without pyspark and starting no JVM::

    from coordinator import (CoordinatorConfig, LocalTransactionState, Message,
                             TransactionListener, TransactionProducer)
    from coordinator import ConsumeResult, MessageListener, TopicConsumer, TransactionalListener

The package by role:

- :mod:`coordinator.protocol`: the protocol's words (record kinds, states, outcomes, limits), both sides;
- :mod:`coordinator.producer`: producers and check-back (delta-rs, no JVM);
- :mod:`coordinator.consumer`: consumer groups handing committed messages to listeners (no JVM);
- :mod:`coordinator.checker`: the checker, a Structured Streaming job (Spark only);
- :mod:`coordinator.control`: the checker's lease and progress record, read by operator tools (no JVM);
- :mod:`coordinator.ops` and :mod:`coordinator.cli`: operator tools and the ``txcoord`` command (no JVM);
- :mod:`coordinator.demo`: the order/credits demo, apart from the product;
- shared by all: :mod:`coordinator.config`, :mod:`coordinator.lakehouse`, :mod:`coordinator.appender`,
  :mod:`coordinator.exceptions`, :mod:`coordinator.logs`, and the table definitions ``coordinator.tables``.
"""

import importlib

_PRODUCER_SIDE = {"Message", "SendStatus", "TransactionListener", "TransactionProducer", "TransactionSendResult"}
_CONSUMER_SIDE = {"ConsumeResult", "ConsumedMessage", "DeltaTableListener", "MessageListener", "TopicConsumer",
                  "TransactionalListener"}
#: Each name the package offers, and the module it comes from.
_FROM = {"CoordinatorConfig": "coordinator.config", "LocalTransactionState": "coordinator.protocol",
         **dict.fromkeys(_PRODUCER_SIDE, "coordinator.producer"), **dict.fromkeys(_CONSUMER_SIDE, "coordinator.consumer")}


def __getattr__(name: str):
    # Every module of the package imports this one first, so it loads nothing until a name is asked for: the
    # checker never loads the producer and consumer sides, and the kit's S3 server (coordinator.conformance.versitygw)
    # is built with Python's standard library alone, before a checkout's virtual environment exists.
    if name in _FROM:
        return getattr(importlib.import_module(_FROM[name]), name)
    raise AttributeError(f"module 'coordinator' has no attribute {name!r}")


__all__ = [
    "ConsumeResult",
    "ConsumedMessage",
    "CoordinatorConfig",
    "DeltaTableListener",
    "LocalTransactionState",
    "Message",
    "MessageListener",
    "SendStatus",
    "TopicConsumer",
    "TransactionalListener",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]
