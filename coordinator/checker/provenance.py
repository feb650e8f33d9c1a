"""Provenance, the first step of a batch's *decide* phase (docs/design.md#a-batchs-steps): a record is taken as
written by whoever may write the log it is stored in.

Who wrote a record is the commit log it came from (:mod:`coordinator.commit_logs`), which the
storage's permissions let only one principal write; the columns a writer fills in only have to
agree with it. Refused, with the reason, before any other rule:

* a record in a group's log that names another producer group;
* an operator's decision (check id ``operator-…``) anywhere but the operators' log;
* in the operators' log, anything but an operator's decision;
* in the retired shared log (``system/commit_log``), anything written after ``txcoord upgrade``
  retired it; what was written there before is taken as it always was;
* a record that could not be read at all (a data file outside its log's directory).

Example::

    records, rejections = refuse_misattributed(records, layout)
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker.context import BatchRecords
from coordinator.checker.refusals import rejection
from coordinator.commit_logs import CommitLogRef, Layout
from coordinator.lakehouse import OPERATORS_LOG_KEY
from coordinator.protocol import OPERATOR_CHECK_PREFIX, RecordKind
from coordinator.validation import first_reasons

__all__ = ["refuse_misattributed"]


def operators_decisions(check_ids: pa.ChunkedArray) -> pa.ChunkedArray:
    """Which records are operators' decisions (``txcoord resolve``): a check id with the operators' prefix.
    The one place that says so; provenance then refuses one found outside the operators' log.

    Example::

        operators_decisions(records.light.column("check_id"))  # [False, True, ...]
    """
    return pc.fill_null(pc.starts_with(check_ids, OPERATOR_CHECK_PREFIX), False)


def refuse_misattributed(records: BatchRecords, layout: Layout) -> tuple[BatchRecords, list[dict]]:
    """The records whose columns agree with the log they were stored in, and the others as rejections.

    Example::

        kept, rejections = refuse_misattributed(records, CommitLogs(lakehouse).layout())
    """
    light = records.light
    reasons = light.column("refusal")
    operators_decision = operators_decisions(light.column("check_id"))
    for key in pc.unique(light.column("commit_log")).drop_null().to_pylist():
        in_log = pc.equal(light.column("commit_log"), key)
        rules = _rules(CommitLogRef(key), light, layout, operators_decision)
        reasons = pc.coalesce(reasons, first_reasons([(pc.and_(in_log, broken), reason) for broken, reason in rules],
                                                     light.num_rows))
    refused = pc.is_valid(reasons)
    if not pc.any(refused).as_py():
        return records, []
    rows = light.append_column("reason", reasons).filter(refused).to_pylist()
    return records.without(refused), [rejection(row, row["reason"]) for row in rows]


def _rules(log: CommitLogRef, light: pa.Table, layout: Layout,
           operators_decision: pa.Array) -> list[tuple[pa.Array, str]]:
    """What a record in ``log`` may not be, each as a mask over ``light`` with its reason
    (``operators_decision`` marks the records whose check id is an operator's)."""
    if log.is_shared:
        retired = (pa.repeat(True, light.num_rows) if layout.shared_log_end is None
                   else pc.greater_equal(light.column("commit_version"), layout.shared_log_end))
        return [(retired, f"written to the shared commit log {log} after `txcoord upgrade` retired it; this producer "
                          "must be upgraded to write its group's own commit log, then send again")]
    if log.is_operators:
        not_decision = pc.or_(pc.invert(operators_decision),
                              pc.fill_null(pc.not_equal(light.column("kind"), RecordKind.END.value), True))
        return [(not_decision, f"{OPERATORS_LOG_KEY} takes operators' decisions only (END records whose check id "
                               f"starts with '{OPERATOR_CHECK_PREFIX}')")]
    groups = light.column("producer_group")
    foreign = pc.fill_null(pc.not_equal(groups, log.group), False)
    named = pc.unique(groups.filter(pc.and_(foreign, pc.equal(light.column("commit_log"), log.key)))).to_pylist()
    return [*((pc.equal(groups, group), f"stored in producer group {log.group!r}'s commit log but names producer "
                                        f"group {group!r}") for group in named),
            (operators_decision, f"an operator's decision (check id '{OPERATOR_CHECK_PREFIX}…') outside {OPERATORS_LOG_KEY}")]
