"""Messages, send results, and the validation every message passes at the edge.

The same rules run in two places: here, where a producer gets a clear error
before anything is written, and in the checker, which refuses (and records in
``system/rejected``) any record that bypassed this API.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from coordinator.exceptions import MessageValidationError

if TYPE_CHECKING:
    from coordinator.listener import LocalTransactionState

#: Property that replaces the default immunity (``transaction_timeout_ms``) for one message.
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"

#: Delay properties: not supported on transactional messages, cleared as RocketMQ does.
DELAY_PROPERTIES = ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")

TOPIC_CHARACTERS = "%|a-zA-Z0-9_-"
#: RocketMQ's topic rule. Matched against the whole name: a trailing newline, which ``$``
#: lets through in both Python's and Java's regex engines, is refused too.
TOPIC_PATTERN = rf"^[{TOPIC_CHARACTERS}]+$"
TOPIC_MAX_LENGTH = 127
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Upper bound of a per-message immunity: one week, far beyond any sane local transaction.
MAX_IMMUNITY_SECONDS = 7 * 24 * 3600

_TOPIC_RE = re.compile(rf"[{TOPIC_CHARACTERS}]+")
#: A per-message immunity, in seconds; the checker applies the same pattern.
IMMUNITY_DIGITS = "[0-9]{1,9}"
_IMMUNITY_RE = re.compile(IMMUNITY_DIGITS)


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid topic name, else raise :class:`MessageValidationError`.

    Example::

        validate_topic("ORDER_TOPIC")  # 'ORDER_TOPIC'
        validate_topic("../x")         # raises MessageValidationError
    """
    if not isinstance(topic, str) or not topic:
        raise MessageValidationError(f"topic must be a non-empty string, got {topic!r}")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise MessageValidationError(f"topic is {len(topic)} characters long; the maximum is {TOPIC_MAX_LENGTH}")
    if not _TOPIC_RE.fullmatch(topic):
        raise MessageValidationError(f"topic {topic!r} does not match {TOPIC_PATTERN}")
    return topic


def parse_immunity_seconds(value: object) -> Optional[int]:
    """Read a ``CHECK_IMMUNITY_TIME_IN_SECONDS`` value: ``None`` if absent, else a positive int.

    Example::

        parse_immunity_seconds("10")  # 10
        parse_immunity_seconds("-1")  # raises MessageValidationError
    """
    if value is None:
        return None
    text = str(value)
    # ASCII digits only, nothing around them: exactly what the checker's own rule accepts.
    if not _IMMUNITY_RE.fullmatch(text) or not 0 < int(text) <= MAX_IMMUNITY_SECONDS:
        raise MessageValidationError(
            f"{CHECK_IMMUNITY_TIME_IN_SECONDS} must be a whole number of seconds in 1..{MAX_IMMUNITY_SECONDS}, got {value!r}"
        )
    return int(text)


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
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            raise MessageValidationError(f"body must be bytes, got {type(self.body).__name__}")
        size = len(self.body)
        if size == 0:
            raise MessageValidationError("body is empty")
        if size > MAX_BODY_BYTES:
            raise MessageValidationError(f"body is {size} bytes; the maximum is {MAX_BODY_BYTES}")
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
        self.body = bytes(self.body)
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
    local_transaction_state: "LocalTransactionState"
    msg_ids: tuple[str, ...] = ()
