"""Processes the benchmarks, the chaos harness and the tests start: a command in a session of its own
(:class:`Job`), and what ``/proc`` says of a process's memory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, TypeVar, Union

from support.environment import REPO_ROOT
from support.waiting import wait_until

T = TypeVar("T")

__all__ = ["Job", "child_environment", "free_port", "proc_status", "process_tree_rss", "reset_peak_rss"]


class Job:
    """``argv`` as a process in a session of its own (a kill reaches everything it spawned: spark-submit's
    JVM runs the checker's Python driver as its child), its output appended to ``log_path``. Started by
    :meth:`start`, and again after it ended, as a supervisor restarts a service; a context manager that
    stops it.

    Example::

        with Job([sys.executable, "-m", "coordinator", "console", ...], "console.log").start() as console:
            ...            # console.stop() on the way out: SIGTERM, SIGKILL after a timeout
        job.kill()         # kill -9 of the whole process group, as a crash
    """

    def __init__(self, argv: list[str], log_path: Union[str, Path], env: Optional[Mapping[str, str]] = None,
                 cwd: Union[str, Path] = REPO_ROOT, stop_signal: int = signal.SIGTERM):
        self.argv, self.log_path, self.cwd, self.stop_signal = argv, str(log_path), cwd, stop_signal
        self.env = None if env is None else dict(env)
        self.process: Optional[subprocess.Popen] = None
        self.started_at = 0.0  # time.monotonic() of the last start
        self.started_wall = 0.0  # time.time() of the same

    def start(self) -> "Job":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self.started_at, self.started_wall = time.monotonic(), time.time()
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> Optional[int]:
        """Its exit status once it has ended (negative: the signal that ended it), else ``None``."""
        return None if self.process is None else self.process.poll()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> int:
        """SIGKILL its whole process group at once, as a crash (``kill -9``: nothing finished, nothing
        released), and wait for it; its exit status (-9)."""
        with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.wait()

    def terminate(self) -> None:
        """Ask it to stop (its ``stop_signal``) without waiting: :meth:`wait` for it."""
        if self.running:
            self.process.send_signal(self.stop_signal)

    def wait(self, timeout_s: float) -> int:
        """Wait for its exit, SIGKILL its process group after ``timeout_s``; its exit status."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return self.kill()

    def stop(self, timeout_s: float = 120) -> int:
        """Its ``stop_signal`` (the checker and the console then finish what they are doing and exit 0),
        SIGKILL after ``timeout_s``; its exit status.

        SIGTERM by default, as systemd stops a service; not SIGINT, which a process started from a shell's
        background job (as `make test`'s second lane runs the benchmarks) inherits ignored.
        """
        self.terminate()
        return self.wait(timeout_s)

    def wait_for(self, condition: Callable[[], T], what: str, timeout_s: float, poll_s: float = 0.5) -> T:
        """Wait until ``condition()`` is truthy and return it; ``RuntimeError`` with the end of its log if the
        process exits first or ``timeout_s`` pass.

        Example::

            master.wait_for(lambda: master.logged("I have been elected leader"), "its election", 120)
        """
        def ready() -> T:
            if not self.running:
                raise RuntimeError(f"{self.argv[0]} exited with {self.exit_code()} before {what}; end of "
                                   f"{self.log_path}:\n{self.tail()}")
            return condition()

        try:
            return wait_until(ready, timeout_s, what, poll_s)
        except TimeoutError as error:
            raise RuntimeError(f"{error}; end of {self.log_path}:\n{self.tail()}") from None

    def logged(self, text: str) -> bool:
        """Whether its log holds ``text``."""
        path = Path(self.log_path)
        return path.exists() and text in path.read_text(errors="replace")

    def tail(self, lines: int = 20) -> str:
        """The last ``lines`` of its log."""
        path = Path(self.log_path)
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc_info) -> None:
        if self.process is not None:
            self.stop()


def free_port() -> int:
    """A TCP port free on loopback now (for a server that must be told its port in advance)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without ``TXCOORD_*`` (a run's TOML decides every setting), unbuffered."""
    clean = {key: value for key, value in env.items() if not key.startswith("TXCOORD_")}
    clean.update(PYTHONUNBUFFERED="1")
    return clean


def proc_status(pid: int) -> dict:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of ``pid`` in MiB, from ``/proc``."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    return found


def process_tree_rss(pid: int) -> Optional[dict]:
    """The RSS (MiB) of process ``pid`` and everything it started, summed (``total_mib``: pages shared by
    forked processes count once in each), the same as PSS (``total_pss_mib``: each shared page split among
    its sharers, so the tree's real footprint), the RSS of its JVMs (``jvm_mib``) and of its other processes
    (``other_mib``: for a checker job its Python driver, its streaming source runner and Python workers),
    with the ``processes`` counted; ``None`` once ``pid`` is gone.

    Example::

        process_tree_rss(checker.process.pid)
        # {'total_mib': 1418.7, 'total_pss_mib': 1101.0, 'jvm_mib': 453.5, 'other_mib': 965.2, 'processes': 9}
    """
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    jvm = other = pss = 0
    counted = 0
    for process in tree:
        try:
            memory = process.memory_full_info()  # smaps_rollup: a few milliseconds for a JVM
            is_jvm = process.name() == "java"
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):  # ended since the tree was listed
            continue
        counted += 1
        pss += memory.pss
        if is_jvm:
            jvm += memory.rss
        else:
            other += memory.rss
    return {"total_mib": round((jvm + other) / 2**20, 1), "total_pss_mib": round(pss / 2**20, 1),
            "jvm_mib": round(jvm / 2**20, 1), "other_mib": round(other / 2**20, 1), "processes": counted}


def reset_peak_rss(pid: int) -> bool:
    """Reset ``pid``'s peak RSS (``VmHWM``) to its current RSS (Linux: ``clear_refs`` 5)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False
