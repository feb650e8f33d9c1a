"""The consumer groups' metrics, served on the checker's Prometheus endpoint (``metrics_port``) beside its own.

Computed at each scrape, on the endpoint's thread, from what ``txcoord consumer-groups describe`` shows
(:func:`coordinator.ops.consumer_groups.describe_consumer_group`), for every consumer group with a grant:

* ``txcoord_consumer_lag_messages{group, topic}``: messages of the topic the group has not handled yet;
* ``txcoord_consumer_lag_seconds{group, topic}``: how long the oldest of them has waited since its commit;
* ``txcoord_consumer_retrying_messages{group, topic}``: messages failed and waiting for another attempt;
* ``txcoord_consumer_dead_letters{group}``: open dead letters (no operator has redriven or discarded them);
* ``txcoord_consumer_live_instances{group}``;
* ``txcoord_consumer_groups_unreadable``: groups left out of this scrape because their records could not be
  read (a corrupt grant or progress record, a refusal by the storage), each named in the checker's log.

A group's redrive table shows as the topic ``~redrive``. A scrape reads no message, whatever the lag: for each
group, its grant, its progress records (one a share), its instances' and its dead letters; for each of its
topics, the log's listing from the newest version the collector knew, the commits since then (or the newest
checkpoint and the commits after it, when that is fewer), and the commit of the oldest version a share has not
finished, for the lag in seconds. The counts of the versions already seen are kept from scrape to scrape (they
never change), so a topic written slowly costs a listing a scrape, and a busy one at most its checkpoint
interval's commits (docs/consumer.md#watching-and-moving-a-group says how the lag is counted, and how near).
Handled and failed calls are counted by the consumer's process, on its own endpoint (``consumer_metrics_port``:
:mod:`coordinator.consumer.metrics`).

Example::

    watch_consumer_groups(checker.exporter.registry, config)   # before or after the endpoint is served
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Callable, Optional

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from coordinator.config import CoordinatorConfig
from coordinator.exceptions import one_line
from coordinator.lakehouse import Lakehouse
from coordinator.lakehouse.row_counts import RowCounts
from coordinator.ops.consumer_groups import consumer_group_grants, describe_consumer_group

__all__ = ["ConsumerGroupsCollector", "watch_consumer_groups"]

log = logging.getLogger("coordinator.checker")


def watch_consumer_groups(registry: CollectorRegistry, config: CoordinatorConfig,
                          clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)) -> None:
    """Serve the consumer groups' metrics of ``config``'s lakehouse from ``registry``, as of each scrape
    (``clock``: what time it is, for the lag in seconds).

    Example::

        watch_consumer_groups(exporter.registry, config)
    """
    registry.register(ConsumerGroupsCollector(config, clock))


class ConsumerGroupsCollector:
    """``txcoord_consumer_*``, as of the scrape (see the module's docstring)."""

    def __init__(self, config: CoordinatorConfig, clock: Callable[[], dt.datetime]):
        self.config, self.clock = config, clock
        self.row_counts: dict[str, RowCounts] = {}  # each source's, kept across scrapes

    def describe(self):  # registering must not run a scrape's storage reads
        return []

    def collect(self):
        by_topic = {name: GaugeMetricFamily(f"txcoord_consumer_{name}", text, labels=["group", "topic"])
                    for name, text in (("lag_messages", "Messages of the topic the consumer group has not handled"),
                                       ("lag_seconds", "How long the oldest message the consumer group has not "
                                                       "handled has waited since its commit (0: none)"),
                                       ("retrying_messages", "Messages that failed and wait for another attempt"))}
        dead = GaugeMetricFamily("txcoord_consumer_dead_letters", "Open dead letters of the consumer group (no "
                                 "operator redrove or discarded them)", labels=["group"])
        live = GaugeMetricFamily("txcoord_consumer_live_instances", "Live instances of the consumer group",
                                 labels=["group"])
        unreadable = 0
        for group, described in self._described():
            if described is None:
                unreadable += 1
                continue
            for topic in described.topics:
                by_topic["lag_messages"].add_metric([group, topic.topic], topic.lag_messages)
                by_topic["lag_seconds"].add_metric([group, topic.topic], topic.lag_seconds)
                by_topic["retrying_messages"].add_metric([group, topic.topic], topic.retrying)
            dead.add_metric([group], described.open_dead_letters)
            live.add_metric([group], len(described.live_instances))
        yield from (*by_topic.values(), dead, live)
        yield GaugeMetricFamily("txcoord_consumer_groups_unreadable", "Consumer groups left out of this scrape: their "
                                "grant or records could not be read (the checker's log says why)", value=unreadable)

    def _described(self):
        """(group, its description, or ``None`` when it could not be read), for every consumer group."""
        try:
            grants, refused = consumer_group_grants(Lakehouse.of(self.config))
        except Exception as error:  # noqa: BLE001  (a storage error must not fail the whole scrape)
            log.warning("metrics: could not list the consumer groups: %s", one_line(error))
            return
        for reason in refused:
            log.warning("metrics: a consumer group left out: %s", reason)
            yield None, None
        now = self.clock()
        for grant in grants:
            yield grant.group, self._describe(grant.group, now)

    def _describe(self, group: str, now: dt.datetime) -> Optional[object]:
        try:
            return describe_consumer_group(self.config, group, now, self.row_counts)
        except Exception as error:  # noqa: BLE001  (one group's corrupt record or refusal costs that group alone)
            log.warning("metrics: consumer group %s left out: %s", group, one_line(error))
            return None
