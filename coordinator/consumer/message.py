"""The message a consumer's listener is handed."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Mapping, Optional

__all__ = ["ConsumedMessage"]


@dataclass(frozen=True)
class ConsumedMessage:
    """A committed message delivered to a :class:`~coordinator.consumer.listener.MessageListener`.

    ``topic``, ``msg_id``, ``transaction_id``, ``keys``, ``tags``, ``properties`` and ``body`` are what the
    producer sent; ``queue_offset`` is its place in the topic (unique in the lakehouse, given by the checker),
    ``commit_timestamp`` when its transaction was committed, ``delivery_attempt`` 1 the first time it is
    handed to this group, counting up on each retry (and afresh after a redrive). ``topic_version`` is the
    version of the topic's Delta table that brought it (-1 for a redriven one): with ``queue_offset`` it is the
    message's position, which a listener may record in its own transaction beside its effect (with
    ``msg_id``, to apply the effect once).

    Example::

        message.topic, message.keys, message.body           # 'ORDER_TOPIC', 'order-42', b'{"amount": 10}'
        message.delivery_attempt                            # 1
        (message.topic_version, message.queue_offset)       # (17, 4242)
    """

    topic: str
    msg_id: str
    transaction_id: Optional[str]
    keys: Optional[str]
    tags: Optional[str]
    properties: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    queue_offset: int = -1
    commit_timestamp: Optional[dt.datetime] = None
    delivery_attempt: int = 1
    born_timestamp: Optional[dt.datetime] = None
    topic_version: int = -1

    def get_property(self, name: str) -> Optional[str]:
        """The value of property ``name``, or ``None``.

        Example::

            message.get_property("region")  # 'eu'
        """
        return self.properties.get(name)
