"""Consumer-side helpers: topics written as the checker writes them, a consumer group granted its topics, and
listeners that record what they are handed."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from typing import Callable, Optional

__all__ = ["RecordingListener", "TopicFeed", "grant"]


class TopicFeed:
    """Appends to topic tables as the checker does: one version per batch, its rows in queue-offset order (by slot
    unless ``by_slot=False``, a topic as written before that), with the checker's application transaction; queue
    offsets count up across every topic, as the half queue's do.

    Example::

        feed = TopicFeed(config)
        feed.deliver("T", [("k1", b"a"), ("k2", b"b")])   # version 0 of topics/T; returns the msg ids
    """

    def __init__(self, config, by_slot: bool = True):
        from coordinator.lakehouse import Lakehouse

        self.lakehouse = Lakehouse.of(config)
        self.by_slot = by_slot
        self.next_offset = 0
        self.batch_id = 0
        self._appenders = {}

    def deliver(self, topic: str, messages: list[tuple[Optional[str], bytes]], offsets: Optional[list[int]] = None) -> list[str]:
        import pyarrow as pa
        from deltalake import CommitProperties, Transaction, write_deltalake

        from coordinator.appender import DeltaAppender
        from coordinator.lakehouse import created_unless_exists
        from coordinator.tables import TOPIC

        if offsets is None:
            offsets = list(range(self.next_offset, self.next_offset + len(messages)))
        self.next_offset = max(self.next_offset, max(offsets) + 1)
        self.batch_id += 1
        now = dt.datetime.now(dt.timezone.utc)
        ids = [uuid.uuid4().hex for _ in messages]
        rows = sorted(({"transaction_id": uuid.uuid4().hex, "msg_id": msg_id, "topic": topic, "keys": keys,
                        "tags": None, "properties": [("p", "v")], "body": body, "born_timestamp": now,
                        "commit_timestamp": now, "queue_offset": offset, "batch_id": self.batch_id}
                       for msg_id, (keys, body), offset in zip(ids, messages, offsets)),
                      key=lambda row: row["queue_offset"])
        data = pa.Table.from_pylist(rows, schema=TOPIC.arrow_schema())
        path = self.lakehouse.topic(topic)
        storage = self.lakehouse.storage or None
        created = created_unless_exists(path, storage, lambda: write_deltalake(
            path, data, mode="append", storage_options=storage, configuration=dict(TOPIC.properties),
            commit_properties=CommitProperties(
                app_transactions=[Transaction("txcoord-checker", self.batch_id)])))
        if not created:
            if topic not in self._appenders:
                self._appenders[topic] = DeltaAppender(path, storage=storage, by_slot=self.by_slot)
            self._appenders[topic].append(data, app_transaction=("txcoord-checker", self.batch_id))
        return ids

    def close(self) -> None:
        for appender in self._appenders.values():
            appender.close()


def grant(config, group: str, topics: list[str], shares: int = 4):
    """Grant consumer group ``group`` the ``topics``, each in ``shares`` shares, as an operator does."""
    from coordinator.consumer.group import ConsumerGroup
    from coordinator.lakehouse import Lakehouse

    return ConsumerGroup(Lakehouse.of(config), group).write_grant(topics, shares, "tester@test")


class RecordingListener:
    """A listener recording each message it is handed (``handled``, in the order calls began), answering what
    ``answer(message)`` returns (default SUCCESS); built on first use so that this module loads no product."""

    def __new__(cls, answer: Optional[Callable] = None):
        from coordinator.consumer import ConsumeResult, MessageListener

        class _Recording(MessageListener):
            def __init__(self):
                self.handled = []
                self.lock = threading.Lock()
                self.changed = threading.Condition(self.lock)

            def consume(self, message):
                with self.lock:
                    self.handled.append(message)
                    self.changed.notify_all()
                return answer(message) if answer else ConsumeResult.SUCCESS

            def bodies(self):
                with self.lock:
                    return [message.body for message in self.handled]

        return _Recording()
