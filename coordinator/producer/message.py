"""Messages and send results; :meth:`Message.validate` applies the rules of
:mod:`coordinator.validation` before anything is written.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from coordinator.exceptions import MessageValidationError
from coordinator.protocol import CHECK_IMMUNITY_TIME_IN_SECONDS, DELAY_PROPERTIES, LocalTransactionState
from coordinator.validation import parse_immunity_seconds, validate_body, validate_topic

__all__ = ["Message", "SendStatus", "TransactionSendResult"]


@dataclass
class Message:
    """A message to send in a transaction.

    ``transaction_id`` and ``msg_id`` are filled in when the message is sent,
    and are present on the message handed to ``check_local_transaction``.

    Example::

        msg = Message("ORDER_TOPIC", b'{"order": 42}', keys="order-42", tags="created",
                      properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "10"})
    """

    topic: str
    body: bytes
    keys: Optional[str] = None
    tags: Optional[str] = None
    properties: Optional[dict[str, str]] = None
    transaction_id: Optional[str] = field(default=None, compare=False)
    msg_id: Optional[str] = field(default=None, compare=False)

    def get_property(self, name: str) -> Optional[str]:
        """The value of property ``name``, or ``None``."""
        return (self.properties or {}).get(name)

    def validate(self) -> None:
        """Check this message against the edge rules and normalise it for sending.

        Raises :class:`MessageValidationError` on a bad topic, body, key, tag or
        property; clears delay properties, which transactional messages do not support.

        Example::

            Message("T", b"").validate()  # raises: body is empty
        """
        validate_topic(self.topic)
        body = validate_body(self.body)
        for name in ("keys", "tags"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise MessageValidationError(f"{name} must be a string or None, got {type(value).__name__}")
        properties = dict(self.properties or {})
        for key, value in properties.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise MessageValidationError(f"property {key!r} must map a string to a string, got {value!r}")
        parse_immunity_seconds(properties.get(CHECK_IMMUNITY_TIME_IN_SECONDS))
        for name in DELAY_PROPERTIES:
            properties.pop(name, None)
        self.body = body
        self.properties = properties


class SendStatus(enum.Enum):
    """Whether the half message was stored (RocketMQ's ``SendStatus``)."""

    SEND_OK = "SEND_OK"


@dataclass(frozen=True)
class TransactionSendResult:
    """What ``send_message_in_transaction`` returns.

    ``msg_id`` is the first message's id when several messages were sent.
    """

    send_status: SendStatus
    transaction_id: str
    msg_id: str
    local_transaction_state: LocalTransactionState
    msg_ids: tuple[str, ...] = ()
