"""Topic grants: which producer groups may publish to which topics (the TOML's ``[topic_grants]``).

Each group names the topics it may publish to, as exact names or shell-style patterns
(``ORDER_*``, ``AUDIT_?``). The checker refuses, whole and with the reason, a transaction with a
message for a topic its group is not granted: it is never delivered.

With no ``[topic_grants]`` table at all, grants are off and every group may publish to every
topic, as before grants existed: the lakehouse is then single-tenant, and the storage's own
permissions on the commit log are its only boundary. With the table, a group that has no entry
may publish nowhere.

Example::

    grants = TopicGrants({"order_group": ["ORDER_TOPIC", "AUDIT_*"]})
    grants.refusal("order_group", "AUDIT_EU")   # None: granted
    grants.refusal("order_group", "PAYMENTS")   # "producer group 'order_group' may not publish to ..."
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Mapping, Optional, Sequence

from coordinator.exceptions import ConfigError
from coordinator.names import NAME_PATTERN, is_name

__all__ = ["TopicGrants"]


class TopicGrants:
    """The topics each producer group may publish to; see the module's documentation."""

    def __init__(self, grants: Optional[Mapping[str, Sequence[str]]] = None) -> None:
        self._grants = {group: tuple(patterns) for group, patterns in (grants or {}).items()}
        self.configured = grants is not None

    @classmethod
    def parse(cls, value: object) -> dict[str, tuple[str, ...]]:
        """The ``[topic_grants]`` table, checked: each group a list of topic names or patterns.

        Example::

            TopicGrants.parse({"order_group": ["ORDER_*"]})  # {'order_group': ('ORDER_*',)}
        """
        if not isinstance(value, Mapping):
            raise ConfigError(f"topic_grants must be a table of producer group = [topics], got {value!r}")
        parsed = {}
        for group, patterns in value.items():
            if not isinstance(group, str) or not group.strip():
                raise ConfigError(f"topic_grants: a producer group is a non-empty name, got {group!r}")
            if isinstance(patterns, str) or not isinstance(patterns, Sequence) or not all(
                    isinstance(p, str) and p.strip() for p in patterns):
                raise ConfigError(f"topic_grants.{group} must be a list of topic names or patterns "
                                  f"(e.g. [\"ORDER_TOPIC\", \"AUDIT_*\"]), got {patterns!r}")
            parsed[group] = tuple(patterns)
        return parsed

    def refusal(self, group: str, topic: str) -> Optional[str]:
        """Why ``group`` may not publish to ``topic``, or None when it may. A pattern grants only names
        that follow the name rule (:data:`coordinator.names.NAME_PATTERN`)."""
        if not is_name(topic):
            return f"topic {topic!r} does not match {NAME_PATTERN}"
        if not self.configured or any(fnmatchcase(topic, pattern) for pattern in self._grants.get(group, ())):
            return None
        granted = ", ".join(self._grants.get(group, ())) or "no topic"
        return f"producer group {group!r} may not publish to topic {topic!r} (topic_grants: {granted})"
