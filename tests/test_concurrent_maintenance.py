"""A checker batch whose writes race a table-property change (what `txcoord maintain
--log-retention-hours` makes) still lands each row once."""

from __future__ import annotations

import logging
import threading

from deltalake import DeltaTable

from coordinator.checker.writer import TableWriter
from coordinator.tables import HALF, OP
from tests.conftest import end_record, half_record


def test_a_batch_racing_property_changes_on_its_tables_still_writes_every_row_once(checker, monkeypatch, caplog):
    names = sorted(f"t{i:02}" for i in range(20))
    for name in names:
        checker.write(half_record(name))
        checker.write(end_record(name))
    lakehouse = checker.config.lakehouse
    changes = []

    def change_properties() -> None:  # as maintenance runs would, each with a new retention
        tables = [DeltaTable(table.path(lakehouse)) for table in (HALF, OP)]
        for _ in range(8):
            for table in tables:
                table.update_incremental()
                table.alter.set_table_properties({"delta.logRetentionDuration": f"interval {len(changes) + 100} hours"})
                changes.append(table.version())
            threading.Event().wait(0.1)

    racer = threading.Thread(target=change_properties)
    append = TableWriter.append

    def racing_append(self, *args, **kwargs):  # the race starts as the batch starts writing
        if not racer.is_alive() and not changes:
            racer.start()
        return append(self, *args, **kwargs)

    monkeypatch.setattr(TableWriter, "append", racing_append)
    with caplog.at_level(logging.WARNING, logger="coordinator.checker"):
        summary = checker.run()
    racer.join()

    assert any("lost to a concurrent change" in r.getMessage() for r in caplog.records)
    assert summary.delivered == len(names)
    for table in ("half", "op", "T"):
        assert sorted(r.transaction_id for r in checker.table(table).collect()) == names
