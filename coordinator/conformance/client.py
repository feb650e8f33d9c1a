"""The client under test, one process per producer instance, driven through the line protocol
(docs/protocol.md#the-line-protocol): ops written to its stdin, its replies and events read from its stdout.

Example::

    with ClientProcess("java -jar client.jar", workdir, deadline) as client:
        client.start(config_path, "conformance_commit")
        reply = client.send([{"topic": "T", "body": b"x"}], "COMMIT_MESSAGE", "ROLLBACK_MESSAGE")
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from coordinator.exceptions import CaseFailedError

__all__ = ["ClientProcess", "Deadline", "message"]


class Deadline:
    """A case's time bound: every wait of the case ends by it (``clock`` is ``time.monotonic``'s kind)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.at = clock() + seconds

    def left(self) -> float:
        return max(0.0, self.at - self.clock())

    def expire(self) -> None:
        """End the case's time now (the kit interrupted): its next wait fails it, and its clients are closed."""
        self.at = self.clock()

    def wait_for(self, condition: Callable[[], object], what: str, poll_s: float = 0.25) -> object:
        """Call ``condition`` until it returns something truthy (returned), or fail the case after the deadline."""
        while True:
            found = condition()
            if found:
                return found
            if self.left() <= 0:
                raise CaseFailedError(f"timed out waiting for {what}")
            threading.Event().wait(min(poll_s, self.left()))


def message(topic: str, body: bytes, keys: Optional[str] = None, tags: Optional[str] = None,
            properties: Optional[dict] = None) -> dict:
    """One message of a ``send`` op."""
    return {"topic": topic, "body": base64.b64encode(body).decode(), "keys": keys, "tags": tags,
            "properties": properties or {}}


class ClientProcess:
    """``sh -c COMMAND`` in ``directory``, in a session of its own (so that :meth:`kill` kills all of it), its
    stderr kept in ``directory/client.stderr``."""

    def __init__(self, command: str, directory: Path, deadline: Deadline):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.deadline = directory, deadline
        self.stderr_path = directory / "client.stderr"
        self.instance_id: Optional[str] = None
        self._requests = itertools.count(1)
        self._lines: list[dict] = []
        self._bad: list[str] = []
        self._changed = threading.Condition()
        with open(self.stderr_path, "ab") as stderr:
            # No TXCOORD_* variable: the client's settings are the kit's TOML alone, as the checker's are.
            env = {key: value for key, value in os.environ.items() if not key.startswith("TXCOORD_")}
            self.process = subprocess.Popen(["sh", "-c", command], cwd=directory, stdin=subprocess.PIPE, env=env,
                                            stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name="conformance-client-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.process.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                line = None
            with self._changed:
                if isinstance(line, dict):
                    self._lines.append(line)
                else:
                    self._bad.append(raw.decode("utf-8", "replace").strip()[:200])
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def events(self, name: str, **fields: object) -> list[dict]:
        """The events called ``name`` the client has printed so far whose ``fields`` match."""
        with self._changed:
            return [line for line in self._lines if line.get("event") == name
                    and all(line.get(key) == value for key, value in fields.items())]

    def wait_event(self, name: str, what: str, **fields: object) -> dict:
        """The first event ``name`` with ``fields``, waited for until the case's deadline."""
        return self._wait(lambda: next(iter(self.events(name, **fields)), None), what)

    def _wait(self, found: Callable[[], Optional[dict]], what: str) -> dict:
        with self._changed:
            while True:
                if self._bad:
                    raise CaseFailedError(f"the client printed a line that is not a JSON object: {self._bad[0]!r}")
                line = found()
                if line is not None:
                    return line
                if self.process.poll() is not None and not self._reader.is_alive():
                    raise CaseFailedError(f"the client exited with code {self.process.returncode} before {what}; "
                                      f"its stderr: {self.stderr_path}")
                if self.deadline.left() <= 0:
                    raise CaseFailedError(f"timed out waiting for {what}")
                self._changed.wait(min(0.5, self.deadline.left()))

    def post(self, op: dict) -> None:
        """Write ``op`` on the client's stdin, not waiting for its reply."""
        try:
            self.process.stdin.write((json.dumps(op) + "\n").encode())
            self.process.stdin.flush()
        except OSError:  # its stdin closed: it has exited, or is exiting
            try:
                code = self.process.wait(max(self.deadline.left(), 1.0))
            except subprocess.TimeoutExpired:
                code = "none yet"
            raise CaseFailedError(f"the client exited with code {code} before the reply to {op['op']!r}; "
                                  f"its stderr: {self.stderr_path}") from None

    def request(self, op: dict) -> dict:
        """Write ``op`` and return its reply (for a ``send``, the reply naming its request)."""
        with self._changed:
            seen = len(self._lines)
        self.post(op)

        def reply() -> Optional[dict]:
            return next((line for line in self._lines[seen:] if line.get("reply") == op["op"]
                         and line.get("request") == op.get("request")), None)

        return self._wait(reply, f"the reply to {op['op']!r}")

    def expect_ok(self, op: dict) -> dict:
        """:meth:`request`, failing the case unless the reply says ``ok``."""
        reply = self.request(op)
        if reply.get("ok") is not True:
            raise CaseFailedError(f"{op['op']} failed: {reply.get('error')}: {reply.get('message')}")
        return reply

    def start(self, config: Path, group: str) -> str:
        """The ``start`` op; the instance id it replied."""
        reply = self.expect_ok({"op": "start", "config": str(config), "group": group})
        if not isinstance(reply.get("instance_id"), str) or not reply["instance_id"]:
            raise CaseFailedError(f"start replied no instance_id: {reply}")
        self.instance_id = reply["instance_id"]
        return self.instance_id

    def send_op(self, messages: list[dict], local_state: str, check_state: str = "UNKNOW", delay_ms: int = 0) -> dict:
        """A ``send`` op with a request id of its own (not yet written)."""
        op = {"op": "send", "request": f"r{next(self._requests)}", "messages": messages, "local_state": local_state,
              "check_state": check_state}
        return op | ({"delay_ms": delay_ms} if delay_ms else {})

    def send(self, messages: list[dict], local_state: str, check_state: str = "UNKNOW", delay_ms: int = 0) -> dict:
        """A ``send`` that must succeed: its reply, checked against the op."""
        reply = self.expect_ok(self.send_op(messages, local_state, check_state, delay_ms))
        ids = reply.get("msg_ids")
        if reply.get("send_status") != "SEND_OK" or not reply.get("transaction_id"):
            raise CaseFailedError(f"send replied no SEND_OK and transaction_id: {reply}")
        if not isinstance(ids, list) or len(ids) != len(messages) or len(set(ids)) != len(ids):
            raise CaseFailedError(f"send replied {ids!r} as msg_ids for {len(messages)} message(s)")
        if reply.get("local_state") != local_state:
            raise CaseFailedError(f"send replied local_state {reply.get('local_state')!r}, the listener returned {local_state}")
        return reply

    def answer(self, transaction_id: str, state: str) -> None:
        self.expect_ok({"op": "answer", "transaction_id": transaction_id, "state": state})

    def kill(self) -> None:
        """``kill -9`` of the client's whole process group, a crash; waits for it."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def stop(self) -> None:
        """The ``stop`` op; the client must then exit 0 (killed after the case's deadline)."""
        self.expect_ok({"op": "stop"})
        try:
            code = self.process.wait(max(self.deadline.left(), 1.0))
        except subprocess.TimeoutExpired:
            raise CaseFailedError("the client did not exit after stop") from None
        if code != 0:
            raise CaseFailedError(f"the client exited with code {code} after stop")

    def close(self) -> None:
        """Whatever became of the case, no client outlives it."""
        if self.process.poll() is None:
            self.kill()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def __enter__(self) -> "ClientProcess":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
