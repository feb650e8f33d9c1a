"""``register_tables``: every table of a lakehouse as a Spark SQL table, topics by name."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from coordinator.lakehouse import Lakehouse, create_table
from coordinator.protocol import CHECK_IMMUNITY_TIME_IN_SECONDS
from coordinator.ops.catalog import lakehouse_tables, register_tables, topic_table_name
from coordinator.tables import SYSTEM_TABLES, TOPIC
from support import end_record, half_record


def test_topic_names_become_sql_names():
    assert topic_table_name("ORDER_TOPIC") == "topic_order_topic"
    assert topic_table_name("a%b|c-d") == "topic_a_b_c_d"


def test_two_topics_with_one_sql_name_are_refused(config):
    for topic in ("A-B", "A_B"):
        create_table(TOPIC, Lakehouse(config.lakehouse).topic(topic))
    with pytest.raises(ValueError, match="both map to the SQL name topic_a_b"):
        lakehouse_tables(config.lakehouse)


def test_registered_tables_answer_sql_time_travel_and_streams(spark, checker):
    for name in ("first", "second"):
        checker.write(half_record(name, topic="Orders-EU"))
        checker.write(end_record(name))
        checker.run()
    patient = {CHECK_IMMUNITY_TIME_IN_SECONDS: "600"}  # its producer's END is still its own after Spark's first queries
    checker.write(half_record("open", topic="Orders-EU", message_index=0, message_count=2, properties=patient),
                  half_record("open", topic="Audit", message_index=1, message_count=2, properties=patient))
    checker.run()

    tables = register_tables(spark, checker.config.lakehouse, database="catalog_test")

    assert set(tables) == {t.name.split("/")[-1] for t in SYSTEM_TABLES} | {"topic_orders_eu"}
    assert spark.sql("SELECT count(*) FROM catalog_test.topic_orders_eu").first()[0] == 2
    assert spark.sql("SELECT count(*) FROM catalog_test.topic_orders_eu VERSION AS OF 0").first()[0] == 1
    assert spark.sql("SELECT count(*) FROM catalog_test.op").first()[0] == 2
    pending = spark.sql("SELECT transaction_id, topic FROM catalog_test.pending").collect()
    assert sorted(tuple(row) for row in pending) == [("open", "Audit"), ("open", "Orders-EU")]
    checker.write(end_record("open", "ROLLBACK_MESSAGE"))
    checker.run()
    assert [r.outcome for r in checker.rows("op", pc.field("transaction_id") == "open")] == ["ROLLBACK"] * 2
    assert spark.table("catalog_test.pending").count() == 0  # a view: it follows the tables
    stream = (spark.readStream.table("catalog_test.topic_orders_eu").writeStream.format("memory")
              .queryName("catalog_test_stream").trigger(availableNow=True).start())
    stream.awaitTermination()
    assert spark.sql("SELECT count(*) FROM catalog_test_stream").first()[0] == 2
    assert register_tables(spark, checker.config.lakehouse, database="catalog_test") == tables  # again: nothing new
