"""Delivering committed messages to their topics, each topic on its own (docs/design.md#a-topic-that-cannot-be-written).

A committed message gets its op row only once its topic row has landed, so a topic that cannot be
written (refused by the storage, a table in a state the checker cannot append to) holds back the
messages addressed to it and nothing else: every other topic's messages are delivered and resolved
as usual. The held-back ones are *withheld*: written once to ``system/undelivered`` (with the op row
they will get and the reason), kept pending, never checked or discarded, and offered to their topic
again by every later batch, older ones first, in one append with the batch's own.

Whether an earlier attempt landed is the topic's to say: every attempt carries the checker's
application transaction (its batch id) and holds every message withheld until then, so a message
first withheld by batch ``b`` has landed exactly when the topic records a batch ``>= b`` of the
checker's. That holds across a crash, a replay and a restart, with nothing remembered but
``system/undelivered``.

Example::

    delivered = deliver(writer, lakehouse, batch_id=12, new=withheld_rows(deliveries, ops), outstanding=state.undelivered)
    delivered.landed        # system/undelivered rows whose topic row is in place: their op rows are due now
    delivered.withheld_now  # this batch's messages held back: system/undelivered's new rows
"""

from __future__ import annotations

import logging
from concurrent.futures import wait
from dataclasses import dataclass, field
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker.context import by_topic, shaped
from coordinator.checker.writer import TableWriter
from coordinator.exceptions import one_line
from coordinator.lakehouse import Lakehouse
from coordinator.protocol import Outcome
from coordinator.tables import MESSAGE_FIELDS, TOPIC, UNDELIVERED

__all__ = ["Delivered", "as_undelivered", "deliver", "op_rows"]

log = logging.getLogger("coordinator.checker")

_OP_FIELDS = ("producer_group", "resolved_at", "end_record_id", "check_id")


@dataclass(frozen=True)
class Delivered:
    """What one batch's deliveries came to, every row in ``system/undelivered``'s shape."""

    landed: pa.Table  # in their topic now (this batch's appends, or an earlier attempt's that did land)
    written_now: pa.Table  # of ``landed``, those this batch's appends wrote: their commit→visible is now
    withheld_now: pa.Table  # this batch's own messages held back: the rows to append to system/undelivered
    withheld: pa.Table  # every message still held back after this batch (``outstanding`` less what landed, plus new)
    reasons: Mapping[str, str] = field(default_factory=dict)  # topic -> why it could not be written
    replayed: bool = False  # some append found this batch's write in place already
    settled: pa.Table = field(default_factory=lambda: UNDELIVERED.arrow_schema().empty_table())  # of ``landed``,
    # those withheld by earlier batches: their op rows are due now


def as_undelivered(deliveries: pa.Table, ops: pa.Table, batch_id: int) -> pa.Table:
    """``deliveries`` (topic rows) joined to their op rows (``ops``, keyed by ``half_offset``), in
    ``system/undelivered``'s shape, stamped with ``batch_id``: what delivering them takes.

    Example::

        as_undelivered(promote(resolved, halves, state), resolved.ops, batch_id=12)
    """
    at = pc.index_in(deliveries.column("queue_offset"), value_set=ops.column("half_offset"))
    op = ops.take(at)
    columns = {name: deliveries.column(name) for name in ("transaction_id", *MESSAGE_FIELDS, "commit_timestamp")}
    columns |= {name: op.column(name) for name in _OP_FIELDS}
    columns["half_offset"] = deliveries.column("queue_offset")
    return shaped(UNDELIVERED, columns, deliveries.num_rows, batch_id)


def op_rows(undelivered: pa.Table) -> pa.Table:
    """The ``system/op`` columns (less ``batch_id``) of messages delivered: one COMMIT per message."""
    return pa.table({"half_offset": undelivered.column("half_offset"),
                     "transaction_id": undelivered.column("transaction_id"),
                     "producer_group": undelivered.column("producer_group"),
                     "outcome": pa.repeat(Outcome.COMMIT.value, undelivered.num_rows),
                     "resolved_at": undelivered.column("resolved_at").cast(pa.int64()),
                     "end_record_id": undelivered.column("end_record_id"),
                     "check_id": undelivered.column("check_id")})


def deliver(writer: TableWriter, lakehouse: Lakehouse, batch_id: int, new: pa.Table,
            outstanding: pa.Table) -> Delivered:
    """Append to each topic its messages: ``outstanding`` (withheld by earlier batches) that have not
    landed since, then ``new`` (this batch's), in queue-offset order, as batch ``batch_id``'s write.
    A topic whose append fails keeps all of them withheld; the others go on.

    Example::

        delivered = deliver(writer, lakehouse, 12, as_undelivered(deliveries, ops, 12), state.undelivered)
    """
    landed, written, withheld, reasons, replayed = [], [], [], {}, False
    candidates = pa.concat_tables([outstanding, new])
    appends = {}  # topic -> (its rows to append, the append under way), every topic's at once
    for topic, rows in by_topic(candidates):
        rows = _in_offset_order(rows)
        path = lakehouse.topic(topic)
        try:
            rows, earlier = _not_landed(writer, path, rows, batch_id)
            landed.append(earlier)
            if rows.num_rows:
                appends[topic] = rows, writer.submit(path, _topic_rows(rows, batch_id), batch_id, created_with=TOPIC)
        except Exception as error:  # the isolation boundary: whatever fails here costs this topic alone
            withheld.append(_withheld(writer, topic, path, rows, batch_id, error, reasons))
    wait([append for _, append in appends.values()])
    for topic, (rows, append) in appends.items():
        try:
            version = append.result()
        except Exception as error:  # the same boundary, for the append itself
            withheld.append(_withheld(writer, topic, lakehouse.topic(topic), rows, batch_id, error, reasons))
        else:
            replayed = replayed or version is None
            landed.append(rows)
            written.append(rows)
    empty = UNDELIVERED.arrow_schema().empty_table()
    withheld_all = pa.concat_tables([empty, *withheld])
    withheld_now = withheld_all.filter(pc.equal(withheld_all.column("batch_id"), batch_id))
    reasoned = pa.array([reasons.get(topic) for topic in withheld_now.column("topic").to_pylist()], pa.string())
    withheld_now = withheld_now.set_column(withheld_now.schema.get_field_index("reason"), "reason", reasoned)
    landed_all = pa.concat_tables([empty, *landed])
    return Delivered(landed_all, pa.concat_tables([empty, *written]), withheld_now, withheld_all, reasons, replayed,
                     landed_all.filter(pc.less(landed_all.column("batch_id"), batch_id)))


def _withheld(writer: TableWriter, topic: str, path: str, rows: pa.Table, batch_id: int, error: Exception,
              reasons: dict[str, str]) -> pa.Table:
    """``rows`` held back from ``topic`` (at ``path``), which failed with ``error``; its reason kept in ``reasons``."""
    reasons[topic] = f"topic {topic!r} cannot be written: {one_line(error)}"
    log.warning("batch %d: %d messages for topic %s withheld: %s", batch_id, rows.num_rows, topic, reasons[topic],
                exc_info=error)
    writer.forget(path)  # the next attempt reads the table afresh
    return rows


def _in_offset_order(rows: pa.Table) -> pa.Table:
    """``rows`` sorted by ``half_offset``: as they are if they are in that order already, as a batch's own
    deliveries are (a sort copies every row, message bodies and all)."""
    offsets = rows.column("half_offset")
    if offsets.null_count == 0 and (rows.num_rows < 2 or pc.all(pc.less_equal(
            offsets.slice(0, rows.num_rows - 1), offsets.slice(1))).as_py()):
        return rows
    return rows.sort_by("half_offset")


def _not_landed(writer: TableWriter, path: str, rows: pa.Table, batch_id: int) -> tuple[pa.Table, pa.Table]:
    """``rows`` split into those still to append and those an earlier attempt landed (see the module's
    docstring); only withheld rows (of batches before ``batch_id``) can have landed."""
    earlier = pc.less(rows.column("batch_id"), batch_id)
    if not pc.any(earlier).as_py():
        return rows, rows.slice(0, 0)
    recorded = writer.recorded(path)
    landed = pc.less_equal(rows.column("batch_id"), recorded)
    return rows.filter(pc.invert(landed)), rows.filter(landed)


def _topic_rows(rows: pa.Table, batch_id: int) -> pa.Table:
    columns = {name: rows.column(name) for name in ("transaction_id", *MESSAGE_FIELDS, "commit_timestamp")}
    return shaped(TOPIC, columns | {"queue_offset": rows.column("half_offset")}, rows.num_rows, batch_id)
