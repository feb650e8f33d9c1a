"""Creating a lakehouse's tables from their definitions in ``tables/``: the system tables, the
operators' commit log, and each producer group's own tables."""

from __future__ import annotations

from typing import Union

from coordinator.lakehouse.delta import create_table
from coordinator.lakehouse.paths import OPERATORS_LOG_KEY, Lakehouse
from coordinator.tables import COMMIT_LOG, GROUP_CHECK_REQUESTS, SYSTEM_TABLES

__all__ = ["create_group_tables", "init_lakehouse"]


def init_lakehouse(lakehouse: Union[str, Lakehouse]) -> list[str]:
    """Create every missing system table under ``lakehouse``, and the operators' commit log; return
    the names created.

    Idempotent: a second call creates nothing.

    Example::

        init_lakehouse("lakehouse")  # ['system/half', ..., 'operators/commit_log']
    """
    lakehouse = Lakehouse.at(lakehouse)
    created = [table.name for table in SYSTEM_TABLES if create_table(table, lakehouse.path(table), lakehouse.storage)]
    if create_table(COMMIT_LOG, lakehouse.operators_log, lakehouse.storage):
        created.append(OPERATORS_LOG_KEY)
    return created


def create_group_tables(lakehouse: Union[str, Lakehouse], group: str) -> list[str]:
    """Create ``group``'s commit log and check-request table under ``lakehouse`` if missing; return
    the paths created.

    Example::

        create_group_tables("lakehouse", "order_group")  # [.../groups/order_group/commit_log, ...]
    """
    lakehouse = Lakehouse.at(lakehouse)
    wanted = ((COMMIT_LOG, lakehouse.commit_log(group)), (GROUP_CHECK_REQUESTS, lakehouse.check_requests(group)))
    return [path for table, path in wanted if create_table(table, path, lakehouse.storage)]
