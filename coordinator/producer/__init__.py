"""The producer side: sending transactional messages and answering check-backs, with delta-rs.

Never imports pyspark and starts no JVM. :mod:`.transaction_producer` sends (half, local
transaction, end), :mod:`.commit_log` makes records durable, :mod:`.checkback` answers the
checker's questions, :mod:`.message` and :mod:`.listener` are what users write.
"""

from coordinator.producer.listener import TransactionListener
from coordinator.producer.message import Message, SendStatus, TransactionSendResult
from coordinator.producer.transaction_producer import TransactionProducer

__all__ = ["Message", "SendStatus", "TransactionListener", "TransactionProducer", "TransactionSendResult"]
