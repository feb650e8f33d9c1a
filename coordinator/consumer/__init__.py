"""The consumer side: a consumer group's instances handing committed messages to a listener, with no JVM.

:mod:`.listener` and :mod:`.message` are what users write and receive, :mod:`.exactly_once` listeners that
apply their effect exactly once (a DB-API database, a Delta table), :mod:`.consumer` the
:class:`TopicConsumer` (shares, order, retries, dead letters), :mod:`.group` the group's records in its own
prefix (``consumers/<group>/``), :mod:`.topic_log` reading a topic's versions as files, :mod:`.workers` the
threads listener calls run on. Never imports pyspark and starts no JVM.

Example::

    from coordinator import ConsumeResult, MessageListener, TopicConsumer

    with TopicConsumer("credits", ["ORDER_TOPIC"], Credits(), config):
        ...
"""

from coordinator.consumer.consumer import TopicConsumer
from coordinator.consumer.exactly_once import DeltaTableListener, TransactionalListener
from coordinator.consumer.listener import ConsumeResult, MessageListener
from coordinator.consumer.message import ConsumedMessage

__all__ = ["ConsumeResult", "ConsumedMessage", "DeltaTableListener", "MessageListener", "TopicConsumer",
           "TransactionalListener"]
