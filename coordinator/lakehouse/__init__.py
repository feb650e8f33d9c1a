"""A lakehouse: where each of its tables and files lives (:mod:`.paths`), opening and creating a Delta
table at a path (:mod:`.delta`), writing a table's checkpoint (:mod:`.checkpoints`), creating its
tables from their definitions in ``tables/`` (:mod:`.provision`), reading them (:mod:`.reads`), reading a
Delta commit that somebody else wrote, as untrusted bytes (:mod:`.deltalog`), counting a table's rows at each
version from its log's statistics (:mod:`.row_counts`), and waiting at exit for what pyarrow's threads still do
(:mod:`.pools`).

Runs through delta-rs, so ``txcoord init`` and producers start no JVM.

Example::

    from coordinator.lakehouse import Lakehouse, init_lakehouse
    from coordinator.tables import OP

    init_lakehouse("lakehouse")
    Lakehouse("lakehouse").read(OP, ["transaction_id", "outcome"]).num_rows
"""

import importlib

from coordinator.lakehouse.paths import (CONSUMERS_KEY, GROUPS_KEY, LAYOUT_KEY, LEASE_KEY, OPERATORS_LOG_KEY,
                                         PROGRESS_KEY, SHARED_LOG_KEY, STANDBYS_KEY, Lakehouse, delta_checkpoint_file,
                                         delta_log_file, group_key, group_of_key, require_lakehouse, topic_names)

# The rest is imported when first used: Spark's Python workers for the checker's streaming source need
# only the paths, and delta-rs with pyarrow's compute functions would lengthen each worker's start.
_LAZY = {"create_table": "delta", "created_unless_exists": "delta", "listing_retried": "delta", "open_table": "delta",
         "create_group_tables": "provision", "init_lakehouse": "provision",
         "query_snapshot": "reads", "read_table": "reads", "table_dataset": "reads", "transaction_ids_in": "reads"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"coordinator.lakehouse.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'coordinator.lakehouse' has no attribute {name!r}")


__all__ = ["CONSUMERS_KEY", "GROUPS_KEY", "LAYOUT_KEY", "LEASE_KEY", "Lakehouse", "OPERATORS_LOG_KEY", "PROGRESS_KEY",
           "SHARED_LOG_KEY", "STANDBYS_KEY", "create_group_tables", "create_table", "created_unless_exists",
           "delta_checkpoint_file", "delta_log_file", "group_key", "group_of_key", "init_lakehouse", "listing_retried",
           "open_table", "query_snapshot", "read_table", "require_lakehouse", "table_dataset", "topic_names",
           "transaction_ids_in"]
