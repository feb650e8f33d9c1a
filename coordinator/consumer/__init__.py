"""The consumer side: a consumer group's instances handing committed messages to a listener, with no JVM.

:mod:`.listener` and :mod:`.message` are what users write and receive, :mod:`.exactly_once` listeners that
apply their effect exactly once (a DB-API database, a Delta table), :mod:`.consumer` the
:class:`TopicConsumer`, made of :mod:`.membership` (its record, the live instances, claims and the fence),
:mod:`.share` (a share's reading and progress) and :mod:`.dispatch` (calls, retries, dead letters);
:mod:`.group` the group's records in its own prefix (``consumers/<group>/``), :mod:`.instances` its
instances' records, :mod:`.topic_log` reading a topic's versions as files, :mod:`.workers` the threads
listener calls run on, :mod:`.metrics` what an instance serves to Prometheus. Never imports pyspark and starts
no JVM.

Example::

    from coordinator import ConsumeResult, MessageListener, TopicConsumer

    with TopicConsumer("credits", ["ORDER_TOPIC"], Credits(), config):
        ...
"""

from coordinator.consumer.consumer import ConsumerHealth, TopicConsumer
from coordinator.consumer.exactly_once import DeltaTableListener, TransactionalListener
from coordinator.consumer.listener import ConsumeResult, MessageListener
from coordinator.consumer.message import ConsumedMessage

__all__ = ["ConsumeResult", "ConsumedMessage", "ConsumerHealth", "DeltaTableListener", "MessageListener", "TopicConsumer",
           "TransactionalListener"]
