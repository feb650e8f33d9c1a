"""A stop between streaming batches, never inside one: the checker's query and the demo's credits
consumer close it before stopping their ``foreachBatch`` query."""

from __future__ import annotations

import threading

from coordinator.exceptions import StopRequested

__all__ = ["BatchGate"]


class BatchGate:
    """Lets a streaming query stop between ``foreachBatch`` batches, never in the middle of one.

    Example::

        gate = BatchGate()
        query = df.writeStream.foreachBatch(lambda df, i: gate.run(i, lambda: process(df))).start()
        gate.close()   # waits for the batch in flight, refuses later ones
        query.stop()   # called after close(), never under it: see close()
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False

    def run(self, batch_id: int, body):
        """Run ``body()`` for batch ``batch_id`` unless the gate is closed (then raise :class:`StopRequested`)."""
        with self._lock:
            if self._closed:
                raise StopRequested(f"stopping; batch {batch_id} is left for the next run")
            return body()

    def close(self) -> None:
        """Wait for the batch in flight, if any, and refuse every later one.

        The lock is not held afterwards: a batch starting while ``query.stop()`` waits for
        it must be able to see the gate closed and fail fast, or the two would wait on
        each other.
        """
        with self._lock:
            self._closed = True

    @property
    def busy(self) -> bool:
        """Whether a batch is running now."""
        return self._lock.locked()
