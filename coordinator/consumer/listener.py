"""What a consumer group implements: the listener that handles each message, and what it answers."""

from __future__ import annotations

import enum
from typing import Any

from coordinator.consumer.message import ConsumedMessage
from coordinator.exceptions import IncompleteListenerError

__all__ = ["ConsumeResult", "MessageListener"]


class ConsumeResult(enum.Enum):
    """What a listener answers for one message (RocketMQ's ``ConsumeConcurrentlyStatus``).

    ``SUCCESS``: handled, never delivered again. ``FAILURE``: deliver it again after the backoff
    (``consumer_retry_delays_ms``); its key's later messages wait meanwhile.
    """

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"


class MessageListener:
    """What a consumer group implements: handle one message, answer :class:`ConsumeResult`.

    Raising counts as ``FAILURE`` (the exception is the message's last error), and so does any
    answer that is not a :class:`ConsumeResult` (``None``, ``True``, a string), with a reason saying
    what came back. ``consume`` is called from several threads at once, for messages of different
    keys; the messages of one key one after another, in their order.

    Example::

        class Credits(MessageListener):
            def consume(self, message):
                with db:
                    db.execute("INSERT INTO credits VALUES (?, ?)", (message.msg_id, message.body))
                return ConsumeResult.SUCCESS
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls.consume is MessageListener.consume:
            raise IncompleteListenerError(f"{cls.__name__} must implement consume")
        return super().__new__(cls)

    def consume(self, message: ConsumedMessage) -> ConsumeResult:
        """Handle ``message``; return ``ConsumeResult.SUCCESS``, or ``FAILURE`` to have it delivered again.

        Example::

            def consume(self, message):
                return ConsumeResult.SUCCESS if apply(message.body) else ConsumeResult.FAILURE
        """
        raise NotImplementedError
