"""The one rule for every name that becomes part of a path or a key: topics, producer groups, producer
instances, transaction and message ids (docs/design.md#names).

The producer, ``txcoord add-group`` and the topic grants apply it to one name
(:func:`validate_name`, :func:`is_name`); the checker to a batch's columns
(:func:`coordinator.validation.message_refusals`), refusing a record that breaks it with the reason.

Example::

    validate_name("topic", "ORDER_TOPIC")   # 'ORDER_TOPIC'
    is_name("CAROL_%2F%2E%2E%2FPAYMENTS")    # False
"""

from __future__ import annotations

import re

from coordinator.exceptions import MessageValidationError

__all__ = ["NAME_MAX_LENGTH", "NAME_PATTERN", "is_name", "validate_name"]

#: RocketMQ's topic characters less ``%`` and ``|``: the table layer decodes ``%`` again
#: (``A%2F%2E%2E%2FB`` would name ``A/../B``). Matched against the whole name: a trailing newline, which
#: ``$`` lets through in Python's and Java's regex engines, is refused too (``fullmatch``; RE2's ``$``).
NAME_PATTERN = r"^[A-Za-z0-9_-]+$"
NAME_MAX_LENGTH = 127
_NAME_RE = re.compile(NAME_PATTERN.removeprefix("^").removesuffix("$"))


def validate_name(kind: str, name: object) -> str:
    """Return ``name`` if it follows the name rule (:data:`NAME_PATTERN`, at most :data:`NAME_MAX_LENGTH`
    characters), else raise :class:`MessageValidationError` saying which ``kind`` of name broke it.

    Example::

        validate_name("producer group", "order_group")  # 'order_group'
        validate_name("producer group", "a/b")          # raises MessageValidationError
    """
    if not isinstance(name, str) or not name:
        raise MessageValidationError(f"{kind} must be a non-empty string, got {name!r}")
    if len(name) > NAME_MAX_LENGTH:
        raise MessageValidationError(f"{kind} is {len(name)} characters long; the maximum is {NAME_MAX_LENGTH}")
    if not _NAME_RE.fullmatch(name):
        raise MessageValidationError(f"{kind} {name[:NAME_MAX_LENGTH]!r} does not match {NAME_PATTERN}")
    return name


def is_name(name: object) -> bool:
    """Whether ``name`` follows the name rule.

    Example::

        is_name("ORDER_*")  # False: a pattern is no name
    """
    return isinstance(name, str) and 0 < len(name) <= NAME_MAX_LENGTH and _NAME_RE.fullmatch(name) is not None
