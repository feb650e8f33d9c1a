"""Placeholder: being written (TransactionProducer)."""


class TransactionProducer:  # replaced by the real producer
    pass
