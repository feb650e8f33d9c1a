"""The rules every message is held to, in one place and in the two forms they are applied in.

Names (topics, groups, ids) follow :mod:`coordinator.names`' rule.
The producer checks one message before anything is written (:func:`validate_topic`,
:func:`validate_body`, :func:`parse_immunity_seconds`, raising :class:`MessageValidationError`);
the checker judges a whole batch of commit-log records at once, over their columns
(:func:`message_refusals`), so that a record written without the producer API is refused exactly
as the API would have refused its message. Both forms read the same limits and patterns below.

Example::

    validate_topic("ORDER_TOPIC")                          # 'ORDER_TOPIC'
    message_refusals(records).to_pylist()                  # [None, 'empty body', ...]
"""

from __future__ import annotations

import re
from typing import Optional, Union

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.exceptions import MessageValidationError
from coordinator.names import NAME_MAX_LENGTH, NAME_PATTERN, validate_name
from coordinator.protocol import CHECK_IMMUNITY_TIME_IN_SECONDS

__all__ = ["MAX_BODY_BYTES", "MAX_IMMUNITY_SECONDS", "first_reasons", "immunity_values", "message_refusals",
           "parse_immunity_seconds", "validate_body", "validate_topic"]

MAX_BODY_BYTES = 4 * 1024 * 1024
#: Upper bound of a per-message immunity: one week, far beyond any sane local transaction.
MAX_IMMUNITY_SECONDS = 7 * 24 * 3600
#: A per-message immunity: ASCII digits only, nothing around them.
_IMMUNITY_PATTERN = r"^[0-9]{1,9}$"

_IMMUNITY_RE = re.compile(_IMMUNITY_PATTERN.removeprefix("^").removesuffix("$"))


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid topic name, else raise :class:`MessageValidationError`.

    Example::

        validate_topic("ORDER_TOPIC")  # 'ORDER_TOPIC'
        validate_topic("../x")         # raises MessageValidationError
    """
    return validate_name("topic", topic)


def validate_body(body: object) -> bytes:
    """Return ``body`` as bytes if it is a valid message body, else raise :class:`MessageValidationError`.

    Example::

        validate_body(b'{"order": 42}')  # b'{"order": 42}'
        validate_body(b"")               # raises MessageValidationError: body is empty
    """
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise MessageValidationError(f"body must be bytes, got {type(body).__name__}")
    size = len(body)
    if size == 0:
        raise MessageValidationError("body is empty")
    if size > MAX_BODY_BYTES:
        raise MessageValidationError(f"body is {size} bytes; the maximum is {MAX_BODY_BYTES}")
    return bytes(body)


def parse_immunity_seconds(value: object) -> Optional[int]:
    """Read a ``CHECK_IMMUNITY_TIME_IN_SECONDS`` value: ``None`` if absent, else a positive int.

    Example::

        parse_immunity_seconds("10")  # 10
        parse_immunity_seconds("-1")  # raises MessageValidationError
    """
    if value is None:
        return None
    text = str(value)
    if not _IMMUNITY_RE.fullmatch(text) or not 0 < int(text) <= MAX_IMMUNITY_SECONDS:
        raise MessageValidationError(
            f"{CHECK_IMMUNITY_TIME_IN_SECONDS} must be a whole number of seconds in 1..{MAX_IMMUNITY_SECONDS}, got {value!r}"
        )
    return int(text)


def immunity_values(properties: pa.Array) -> pa.Array:
    """Each record's ``CHECK_IMMUNITY_TIME_IN_SECONDS`` property (its first), as written; null where absent.

    Example::

        immunity_values(records.column("properties")).to_pylist()  # [None, '10', ...]
    """
    return pc.map_lookup(properties, CHECK_IMMUNITY_TIME_IN_SECONDS, "first")


def message_refusals(records: pa.Table) -> pa.Array:
    """For each commit-log record, the reason of the first message rule it breaks; null where it breaks none.

    ``records`` has the commit log's message columns, with ``body_size`` (the body's length in bytes)
    in place of ``body``. Blank means null or nothing but spaces (SQL's ``trim``, which the rule had first).

    Example::

        message_refusals(records).to_pylist()  # [None, 'missing topic', None, 'empty body']
    """
    topic = records.column("topic")
    body_size = records.column("body_size")
    index, count = records.column("message_index"), records.column("message_count")
    immunity = immunity_values(records.column("properties"))
    valid_immunity = pc.match_substring_regex(immunity, _IMMUNITY_PATTERN)
    immunity_s = pc.if_else(valid_immunity, immunity, "0").cast(pa.int64())
    rules = [
        (pc.is_null(records.column("record_id")), "missing record_id"),
        *_name_rules("transaction_id", records.column("transaction_id")),
        *_name_rules("producer_group", records.column("producer_group")),
        *_name_rules("msg_id", records.column("msg_id")),
        *_name_rules("topic", topic),
        (pc.fill_null(pc.equal(body_size, 0), True), "empty body"),
        (pc.greater(body_size, MAX_BODY_BYTES), f"body larger than {MAX_BODY_BYTES} bytes"),
        (_bad_numbering(index, count), "bad message_index/message_count"),
        (pc.and_(pc.is_valid(immunity), pc.invert(pc.and_(valid_immunity, pc.and_(
            pc.greater_equal(immunity_s, 1), pc.less_equal(immunity_s, MAX_IMMUNITY_SECONDS))))),
         f"bad {CHECK_IMMUNITY_TIME_IN_SECONDS}"),
    ]
    return first_reasons(rules, records.num_rows)


def first_reasons(rules: list[tuple[pa.Array, Union[str, pa.Array]]], num_rows: int) -> pa.Array:
    """Per row, the reason of the first rule (a mask, True: broken; null counts as kept) that it breaks:
    a rule's reason is one string, or one per row.

    Example::

        first_reasons([(pc.is_null(ids), "missing id")], len(ids))
    """
    reasons = pa.nulls(num_rows, pa.string())
    for broken, reason in reversed(rules):
        broken = pc.fill_null(broken, False)
        if pc.any(broken).as_py():  # most rules break on no row: no reasons rebuilt for them
            reasons = pc.if_else(broken, reason, reasons)
    return reasons


def _name_rules(column: str, values: pa.Array) -> list[tuple[pa.Array, str]]:
    """The name rule over a column: missing (blank), too long, or other characters."""
    return [(_blank(values), f"missing {column}"),
            (pc.greater(pc.utf8_length(values), NAME_MAX_LENGTH), f"{column} longer than {NAME_MAX_LENGTH} characters"),
            (pc.invert(pc.match_substring_regex(values, NAME_PATTERN)), f"{column} does not match {NAME_PATTERN}")]


def _blank(values: pa.Array) -> pa.Array:
    return pc.fill_null(pc.equal(pc.utf8_trim(values, " "), ""), True)


def _bad_numbering(index: pa.Array, count: pa.Array) -> pa.Array:
    return pc.fill_null(pc.or_(pc.or_(pc.less(count, 1), pc.less(index, 0)), pc.greater_equal(index, count)), True)
