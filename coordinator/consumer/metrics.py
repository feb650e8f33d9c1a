"""A consumer process's own Prometheus metrics, served when ``consumer_metrics_port`` is set, by
``prometheus_client`` (as the checker's are), one endpoint per process whatever the number of consumers in it:

* ``txcoord_consumer_calls_total{group, topic, outcome}``: listener calls by outcome: ``handled``, ``failed``;
* ``txcoord_consumer_retries_total{group, topic}``: failed messages scheduled for another attempt;
* ``txcoord_consumer_dead_lettered_total{group, topic}``: messages moved to the group's dead letters;
* ``txcoord_consumer_handling_seconds{group, topic}``: a histogram of the successful calls' durations;
* ``txcoord_consumer_positions_gone_total{group, topic}``: a share's version gone (``consumer_position_gone``);
* ``txcoord_consumer_shares_held{group, instance}``, ``txcoord_consumer_shares_stopped{group, instance}`` (by an
  error it does not retry), ``txcoord_consumer_fenced{group, instance}`` (1 while it may have lost its shares);
* ``txcoord_consumer_instance_lag_messages{group, instance, topic}``: messages of its shares not handled yet, as
  far as the instance has looked (:meth:`TopicConsumer.lag`);
* ``txcoord_consumer_read_bytes_total{group, instance, topic}``, ``txcoord_consumer_read_rows_total{...}``: what the
  instance has read of the topic's data files (of a topic written by slot, about its shares' part).

``topic`` is ``~redrive`` for the group's redrive table. The gauges are computed at each scrape from the
instances' memory: a scrape makes no request to the storage.

Example::

    config = config.replace(consumer_metrics_port=9465)
    with TopicConsumer("credits", ["ORDER_TOPIC"], Credits(), config):
        ...   # curl http://localhost:9465/metrics
"""

from __future__ import annotations

import threading
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from coordinator.config import CoordinatorConfig
from coordinator.consumer.dispatch import CallCounts

__all__ = ["ConsumerMetrics", "serve_consumer_metrics"]


class _Instance(Protocol):
    """What the gauges read of a consumer instance (a :class:`~coordinator.consumer.consumer.TopicConsumer`)."""

    group: str
    instance_id: str

    def health(self): ...

    def lag(self) -> dict[str, int]: ...

    def read_totals(self) -> dict[str, tuple[int, int]]: ...


_served: dict[tuple[str, int], "ConsumerMetrics"] = {}
_serving = threading.Lock()


def serve_consumer_metrics(consumer: _Instance, config: CoordinatorConfig) -> "ConsumerMetrics":
    """The process's consumer metrics at ``config``'s ``metrics_host:consumer_metrics_port``, served from the first
    call on, with ``consumer`` among the instances its gauges show.

    Example::

        metrics = serve_consumer_metrics(consumer, config)
        metrics.port   # the port it listens on (the one asked for, or any free one for 0)
    """
    with _serving:
        key = (config.metrics_host, config.consumer_metrics_port)
        metrics = _served.get(key)
        if metrics is None:
            metrics = _served[key] = ConsumerMetrics()
            server, _ = start_http_server(config.consumer_metrics_port, addr=config.metrics_host,
                                          registry=metrics.registry)
            metrics.port = server.server_port
        metrics.consumers.add(consumer)
        return metrics


class ConsumerMetrics:
    """The registry of one endpoint (see the module's docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.port = 0
        self.consumers: set[_Instance] = set()
        self.calls = Counter("txcoord_consumer_calls", "Listener calls, by outcome.", ["group", "topic", "outcome"],
                             registry=self.registry)
        self.retries = Counter("txcoord_consumer_retries", "Failed messages scheduled for another attempt.",
                               ["group", "topic"], registry=self.registry)
        self.dead = Counter("txcoord_consumer_dead_lettered", "Messages moved to the group's dead letters.",
                            ["group", "topic"], registry=self.registry)
        self.handling = Histogram("txcoord_consumer_handling_seconds", "Successful listener calls' durations.",
                                  ["group", "topic"], registry=self.registry,
                                  buckets=(.001, .005, .01, .05, .1, .5, 1, 5, 30, 120, 900))
        self.gone = Counter("txcoord_consumer_positions_gone", "Share positions found gone (log cleanup, vacuum).",
                            ["group", "topic"], registry=self.registry)
        self.registry.register(_InstancesCollector(self))

    def counts(self, group: str) -> CallCounts:
        """What a :class:`~coordinator.consumer.dispatch.Dispatcher` of ``group`` counts its calls with."""
        return CallCounts(
            handled=lambda topic, seconds: (self.calls.labels(group, topic, "handled").inc(),
                                            self.handling.labels(group, topic).observe(seconds)),
            failed=lambda topic: self.calls.labels(group, topic, "failed").inc(),
            retried=lambda topic: self.retries.labels(group, topic).inc(),
            dead=lambda topic: self.dead.labels(group, topic).inc())

    def position_gone(self, group: str, topic: str) -> None:
        self.gone.labels(group, topic).inc()

    def forget(self, consumer: _Instance) -> None:
        """Show ``consumer`` no more (it closed); its counts stay."""
        with _serving:
            self.consumers.discard(consumer)


class _InstancesCollector:
    def __init__(self, metrics: ConsumerMetrics):
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        held = GaugeMetricFamily("txcoord_consumer_shares_held", "Shares the instance holds.",
                                 labels=["group", "instance"])
        stopped = GaugeMetricFamily("txcoord_consumer_shares_stopped",
                                    "Shares stopped by an error the instance does not retry.", labels=["group", "instance"])
        fenced = GaugeMetricFamily("txcoord_consumer_fenced", "1 while the instance may have lost its shares.",
                                   labels=["group", "instance"])
        lag = GaugeMetricFamily("txcoord_consumer_instance_lag_messages",
                                "Messages of the instance's shares not handled yet.", labels=["group", "instance", "topic"])
        read_bytes = CounterMetricFamily("txcoord_consumer_read_bytes", "Bytes of the topic's data files the "
                                         "instance has read.", labels=["group", "instance", "topic"])
        read_rows = CounterMetricFamily("txcoord_consumer_read_rows", "Rows of the topic's data files the instance "
                                        "has read.", labels=["group", "instance", "topic"])
        with _serving:
            consumers = list(self.metrics.consumers)
        for consumer in consumers:
            health = consumer.health()
            labels = [consumer.group, consumer.instance_id]
            held.add_metric(labels, len(health.shares))
            stopped.add_metric(labels, len(health.stopped_shares))
            fenced.add_metric(labels, 1 if health.fenced else 0)
            for topic, count in consumer.lag().items():
                lag.add_metric([*labels, topic], count)
            for topic, (count_bytes, count_rows) in consumer.read_totals().items():
                read_bytes.add_metric([*labels, topic], count_bytes)
                read_rows.add_metric([*labels, topic], count_rows)
        return [held, stopped, fenced, lag, read_bytes, read_rows]
