"""A checker batch whose tables had a property changed since its last write (what `txcoord maintain
--log-retention-hours` does beside a running checker) still lands each row once."""

from __future__ import annotations

import logging

from deltalake import DeltaTable

from coordinator.lakehouse import Lakehouse
from coordinator.tables import HALF, OP
from support import end_record, half_record


def test_a_batch_after_property_changes_on_its_tables_still_writes_every_row_once(checker, caplog):
    names = sorted(f"t{i:02}" for i in range(20))
    earlier, later = names[:10], names[10:]
    for name in earlier:
        checker.write(half_record(name))
        checker.write(end_record(name))
    checker.run()
    # As a maintenance run would, between two batches: the checker's view of these tables is now stale,
    # so its next appends lose the race for the next version and take in the change before trying again.
    for table in (HALF, OP):
        DeltaTable(Lakehouse(checker.config.lakehouse).path(table)).alter.set_table_properties(
            {"delta.logRetentionDuration": "interval 100 hours"})
    for name in later:
        checker.write(half_record(name))
        checker.write(end_record(name))
    with caplog.at_level(logging.INFO, logger="coordinator.appender"):
        summary = checker.run()

    assert sum("changed the table's metadata" in r.getMessage() for r in caplog.records) == 2
    assert summary.delivered == len(later)
    for table in ("half", "op", "T"):
        assert sorted(r.transaction_id for r in checker.rows(table)) == names
    for table in (HALF, OP):
        assert DeltaTable(Lakehouse(checker.config.lakehouse).path(table)).metadata().configuration[
            "delta.logRetentionDuration"] == "interval 100 hours"
