"""Transactional messages on Delta Lake, coordinated by Spark Structured Streaming.

What a producer needs, importable without pyspark and starting no JVM::

    from coordinator import (CoordinatorConfig, LocalTransactionState, Message,
                             TransactionListener, TransactionProducer)

The package by role:

- :mod:`coordinator.protocol`: the protocol's words (record kinds, states, outcomes, limits), both sides;
- :mod:`coordinator.producer`: producers and check-back (delta-rs, no JVM);
- :mod:`coordinator.checker`: the checker, a Structured Streaming job (Spark only);
- :mod:`coordinator.control`: the checker's lease and progress record, read by operator tools (no JVM);
- :mod:`coordinator.ops` and :mod:`coordinator.cli`: operator tools and the ``txcoord`` command (no JVM);
- :mod:`coordinator.demo`: the order/credits demo, apart from the product;
- shared by all: :mod:`coordinator.config`, :mod:`coordinator.lakehouse`, :mod:`coordinator.appender`,
  :mod:`coordinator.exceptions`, :mod:`coordinator.logs`, and the table definitions ``coordinator.tables``.
"""

from coordinator.config import CoordinatorConfig
from coordinator.protocol import LocalTransactionState

_PRODUCER_SIDE = {"Message", "SendStatus", "TransactionListener", "TransactionProducer", "TransactionSendResult"}


def __getattr__(name: str):
    # Every module of the package imports this one first: the producer side is loaded only when
    # asked for, so that the checker, which never imports it, does not load it either.
    if name in _PRODUCER_SIDE:
        import coordinator.producer

        return getattr(coordinator.producer, name)
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
