"""Step 0 — provenance: a record is taken as written by whoever may write the log it is stored in.

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

from typing import Optional

from coordinator.checker.context import BatchRecords
from coordinator.checker.refusals import rejection
from coordinator.commit_logs import CommitLogRef, Layout
from coordinator.lakehouse import OPERATORS_LOG_KEY
from coordinator.protocol import OPERATOR_CHECK_PREFIX, RecordKind

__all__ = ["refuse_misattributed"]


def refuse_misattributed(records: BatchRecords, layout: Layout) -> tuple[BatchRecords, list[dict]]:
    """The records whose columns agree with the log they were stored in, and the others as rejections.

    Example::

        kept, rejections = refuse_misattributed(records, CommitLogs(lakehouse).layout())
    """
    rejections, refused = [], set()
    for record in records.rows:
        reason = _misattribution(record, layout)
        if reason is not None:
            rejections.append(rejection(record, reason))
            refused.add(record["row"])
    return (records.without(refused) if refused else records), rejections


def _misattribution(record: dict, layout: Layout) -> Optional[str]:
    if record["refusal"] is not None:
        return record["refusal"]
    log = CommitLogRef(record["commit_log"])
    operators_decision = (record["check_id"] or "").startswith(OPERATOR_CHECK_PREFIX)
    if log.is_shared:
        if layout.shared_log_end is None or record["commit_version"] >= layout.shared_log_end:
            return (f"written to the shared commit log {log} after `txcoord upgrade` retired it; this producer must be "
                    "upgraded to write its group's own commit log, then send again")
        return None
    if log.is_operators:
        if record["kind"] != RecordKind.END or not operators_decision:
            return (f"{OPERATORS_LOG_KEY} takes operators' decisions only (END records whose check id starts with "
                    f"'{OPERATOR_CHECK_PREFIX}')")
        return None
    if record["producer_group"] is not None and record["producer_group"] != log.group:
        return (f"stored in producer group {log.group!r}'s commit log but names producer group "
                f"{record['producer_group']!r}")
    if operators_decision:
        return f"an operator's decision (check id '{OPERATOR_CHECK_PREFIX}…') outside {OPERATORS_LOG_KEY}"
    return None
