"""The Python producer under the conformance kit's line protocol (docs/protocol.md#the-line-protocol): ops
on stdin, replies and events on stdout, logs on stderr. The kit's first conforming client.

    txcoord conformance --producer ".venv/bin/python -m coordinator.conformance.python_client"

It starts no JVM: it is a producer process like any service's.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import threading
from typing import Any, Callable, Optional, TextIO

from coordinator.config import CoordinatorConfig
from coordinator.exceptions import ProducerStateError
from coordinator.producer.listener import TransactionListener
from coordinator.producer.message import Message
from coordinator.producer.transaction_producer import TransactionProducer
from coordinator.protocol import LocalTransactionState

__all__ = ["Driver", "ScriptedListener", "main"]

HANG = "HANG"


class ScriptedListener(TransactionListener):
    """Runs each send's scripted local transaction, and answers each check with the state last set for its
    transaction (a send's ``check_state`` or an ``answer`` op), ``UNKNOW`` if none; reports each as an event."""

    def __init__(self, emit: Callable[[dict], None]):
        self._emit = emit
        self._lock = threading.Lock()
        self._answers: dict[str, str] = {}

    def set_answer(self, transaction_id: str, state: str) -> None:
        with self._lock:
            self._answers[transaction_id] = state

    def execute_local_transaction(self, msg: Any, arg: dict) -> LocalTransactionState:
        first = msg[0] if isinstance(msg, list) else msg
        self.set_answer(first.transaction_id, arg.get("check_state") or "UNKNOW")
        if arg["local_state"] == HANG:
            self._emit({"event": "executing", "request": arg.get("request"), "transaction_id": first.transaction_id})
            threading.Event().wait()  # a crash after the half: the kit kills the process
        threading.Event().wait(int(arg.get("delay_ms") or 0) / 1000)
        return LocalTransactionState(arg["local_state"])

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        self._emit({"event": "check", "transaction_id": msg.transaction_id, "msg_id": msg.msg_id, "topic": msg.topic})
        with self._lock:
            return LocalTransactionState(self._answers.get(msg.transaction_id, "UNKNOW"))


class Driver:
    """One producer instance driven by ops: :meth:`handle` takes one op and returns its reply."""

    def __init__(self, out: TextIO):
        self._out = out
        self._out_lock = threading.Lock()
        self.listener = ScriptedListener(self.emit)
        self.producer: Optional[TransactionProducer] = None
        self.stopped = False

    def emit(self, line: dict) -> None:
        """Write one JSON line, whole, whichever thread calls."""
        with self._out_lock:
            self._out.write(json.dumps(line) + "\n")
            self._out.flush()

    def handle(self, op: dict) -> dict:
        name = op.get("op")
        handler = {"start": self._start, "send": self._send, "answer": self._answer, "stop": self._stop}.get(name)
        reply: dict = {"reply": name}
        if name == "send":
            reply["request"] = op.get("request")
        if handler is None:
            return reply | {"ok": False, "error": "UnknownOp", "message": f"unknown op {name!r}"}
        try:
            return reply | {"ok": True} | handler(op)
        except Exception as error:  # every failure is the op's answer, not the driver's end
            logging.getLogger("coordinator.conformance").info("op %s failed", name, exc_info=True)
            failed = {"ok": False, "error": type(error).__name__, "retriable": bool(getattr(error, "retriable", False)),
                      "outcome_unknown": bool(getattr(error, "outcome_unknown", False)), "message": str(error)}
            if getattr(error, "transaction_id", None):
                failed["transaction_id"] = error.transaction_id
            return reply | failed

    def _start(self, op: dict) -> dict:
        config = CoordinatorConfig.load(op["config"])
        self.producer = TransactionProducer(op["group"], self.listener, config).start()
        return {"instance_id": self.producer.instance_id}

    def _send(self, op: dict) -> dict:
        if self.producer is None:
            raise ProducerStateError("send before start")
        messages = [Message(m["topic"], base64.b64decode(m["body"]), keys=m.get("keys"), tags=m.get("tags"),
                            properties=m.get("properties")) for m in op["messages"]]
        if len(messages) == 1:
            result = self.producer.send_message_in_transaction(messages[0], op)
        else:
            result = self.producer.send_messages_in_transaction(messages, op)
        return {"send_status": result.send_status.value, "transaction_id": result.transaction_id,
                "msg_ids": list(result.msg_ids), "local_state": result.local_transaction_state.value}

    def _answer(self, op: dict) -> dict:
        self.listener.set_answer(op["transaction_id"], LocalTransactionState(op["state"]).value)
        return {}

    def _stop(self, op: dict) -> dict:
        if self.producer is not None:
            self.producer.shutdown()
        self.stopped = True
        return {}


def main(stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    """Serve ops from ``stdin`` until ``stop`` (exit 0) or the end of the input (the producer is shut down)."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    driver = Driver(stdout)
    for line in stdin:
        if not line.strip():
            continue
        try:
            op = json.loads(line)
        except ValueError:
            op = None
        if not isinstance(op, dict):
            driver.emit({"reply": None, "ok": False, "error": "BadRequest", "message": "not a JSON object"})
            continue
        driver.emit(driver.handle(op))
        if driver.stopped:
            return 0
    driver.handle({"op": "stop"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
