"""Structured logs: every line about a transaction carries its id as a field."""

from __future__ import annotations

import json
import logging
import re

import pytest

from coordinator.logs import JsonFormatter


def test_a_record_becomes_one_json_line_with_its_context():
    record = logging.LogRecord("coordinator.producer.transaction_producer", logging.WARNING, __file__, 1,
                               "end record not stored transaction_id=%s", ("t1",), None)
    record.transaction_id, record.producer_group = "t1", "g"

    line = json.loads(JsonFormatter().format(record))

    assert line["message"] == "end record not stored transaction_id=t1"
    assert (line["level"], line["logger"], line["transaction_id"], line["producer_group"]) == (
        "WARNING", "coordinator.producer.transaction_producer", "t1", "g")
    assert "check_id" not in line


@pytest.mark.slow
def test_every_demo_producer_line_about_a_transaction_names_it_as_a_field(demo):
    lakehouse, _, _ = demo
    lines = [json.loads(line) for line in (lakehouse / "producer.log").read_text().splitlines()]

    about_transactions = [line for line in lines if "transaction_id=" in line["message"]]
    # The demo's order service sends, and answers checks: both kinds of line are there.
    assert {"transaction sent", "check answered"} <= {line["message"].split(" transaction_id=")[0] for line in about_transactions}
    for line in about_transactions:
        assert line["transaction_id"] == re.search(r"transaction_id=(\w+)", line["message"]).group(1), line
