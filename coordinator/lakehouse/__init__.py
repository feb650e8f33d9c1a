"""A lakehouse: where each of its tables and files lives (:mod:`.paths`), opening and creating a Delta
table at a path (:mod:`.delta`), writing a table's checkpoint (:mod:`.checkpoints`), creating its
tables from their definitions in ``tables/`` (:mod:`.provision`), and reading them (:mod:`.reads`).

Runs through delta-rs, so ``txcoord init`` and producers start no JVM.

Example::

    from coordinator.lakehouse import Lakehouse, init_lakehouse
    from coordinator.tables import OP

    init_lakehouse("lakehouse")
    Lakehouse("lakehouse").read(OP, ["transaction_id", "outcome"]).num_rows
"""

from coordinator.lakehouse.delta import create_table, listing_retried, open_table
from coordinator.lakehouse.paths import (GROUPS_KEY, LAYOUT_KEY, LEASE_KEY, OPERATORS_LOG_KEY, PROGRESS_KEY, SHARED_LOG_KEY,
                                         STANDBYS_KEY, Lakehouse, group_key, group_of_key, require_lakehouse, topic_names)
from coordinator.lakehouse.provision import create_group_tables, init_lakehouse
from coordinator.lakehouse.reads import read_table, table_dataset, transaction_ids_in

__all__ = ["GROUPS_KEY", "LAYOUT_KEY", "LEASE_KEY", "Lakehouse", "OPERATORS_LOG_KEY", "PROGRESS_KEY", "SHARED_LOG_KEY",
           "STANDBYS_KEY", "create_group_tables", "create_table", "group_key", "group_of_key", "init_lakehouse",
           "listing_retried", "open_table", "read_table", "require_lakehouse", "table_dataset", "topic_names",
           "transaction_ids_in"]
