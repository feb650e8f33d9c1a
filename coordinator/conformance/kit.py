"""``txcoord conformance``: one real checker on a fresh lakehouse, then the cases against the client under
test, several at once (each with its own client processes and producer group), one ``PASS``/``FAIL`` line each
in the case list's order and a summary (docs/protocol.md#the-conformance-kit). The top of the kit: it runs the
case list (:mod:`.cases`), and nothing of the kit imports it.

Example::

    code = run_kit(KitOptions(command=".venv/bin/python -m coordinator.conformance.python_client"))
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from coordinator.conformance.cases import CASES, OBJECT_STORE_CASES, chosen_cases, start_order
from coordinator.conformance.client import Deadline
from coordinator.conformance.primitives import Case, Run, write_config
from coordinator.conformance.object_store import ObjectStore
from coordinator.exceptions import CaseFailedError, ConformanceKitError
from coordinator.lakehouse import Lakehouse, init_lakehouse

__all__ = ["DEFAULT_PARALLEL", "KitOptions", "run_cases", "run_kit"]

CHECKER_START_TIMEOUT_S = 300.0
#: Cases run at once by default: every case of the kit (those of --object-store too), even on CI's 2 cores, as each
#: spends most of its time waiting for the checker (its first batch first), and the waits overlap; a bound all
#: the same, on the client processes alive at once (docs/performance-log.md#conformance-kit).
DEFAULT_PARALLEL = len(CASES) + len(OBJECT_STORE_CASES)
_STOP_TIMEOUT_S = 60.0

Out = Callable[[str], None]


@dataclass(frozen=True)
class KitOptions:
    """What ``txcoord conformance`` was asked: the client's ``command``, the ``cases`` to run (all if empty)."""

    command: str
    cases: tuple[str, ...] = ()
    case_timeout_s: float = 60.0
    workdir: Optional[str] = None
    object_store: bool = False
    parallel: int = DEFAULT_PARALLEL


class Checker:
    """The real checker (``spark-submit`` of the checker job, as deployed) on the run's TOML, its output in
    ``<workdir>/checker.log``."""

    def __init__(self, run: Run):
        from coordinator.spark import spark_job_environment, spark_submit

        argv, _ = spark_submit("checker", "--config", str(run.config))
        if not Path(argv[0]).exists():
            raise ConformanceKitError(f"{argv[0]} not found: the kit needs pyspark beside txcoord (`pip install 'txcoord[spark]'`)")
        env = {key: value for key, value in spark_job_environment().items() if not key.startswith("TXCOORD_")}
        self.log_path = run.workdir / "checker.log"
        self.run = run
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=run.workdir,
                                            env=env | {"PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout_s: float = CHECKER_START_TIMEOUT_S) -> float:
        """Wait for its first batch (its progress record); the seconds it took."""
        from coordinator.control.progress import CheckerProgress

        started, progress = time.monotonic(), CheckerProgress(self.run.lakehouse)
        while progress.load() is None:
            if self.process.poll() is not None:
                raise ConformanceKitError(f"the checker exited with code {self.process.returncode}; see {self.log_path}")
            if time.monotonic() - started > timeout_s:
                raise ConformanceKitError(f"the checker made no batch within {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.2)
        return time.monotonic() - started

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM (it finishes its batch), killed after a minute."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def run_case(run: Run, name: str, case: Case, deadline: Optional[Deadline] = None) -> Optional[str]:
    """Run one case within its timeout (``deadline``, by default one of ``run.case_timeout_s`` from now); ``None``
    if it passed, else why it failed."""
    deadline = deadline or Deadline(run.case_timeout_s)
    try:
        with run.clients(name, deadline) as new_client:
            case(run, deadline, new_client)
    except CaseFailedError as failure:
        return str(failure)
    except Exception as error:  # a case that breaks is a failed case, never the end of the run
        return f"{type(error).__name__}: {error}"
    return None


def prepare(options: KitOptions, stack: contextlib.ExitStack, out: Out) -> Run:
    """The run's directory, its fresh lakehouse (on the S3 server with ``object_store``) and its TOML."""
    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="txcoord-conformance-")).resolve()
    if options.workdir and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    store = None
    if options.object_store:
        store = stack.enter_context(ObjectStore(workdir / "s3"))
        lakehouse = store.lakehouse
    else:
        lakehouse = Lakehouse(str(workdir / "lakehouse"))
    init_lakehouse(lakehouse)
    run = Run(options.command, workdir, lakehouse, write_config(workdir / "coordinator.toml", lakehouse),
              options.case_timeout_s, store)
    if store is not None:
        store.provision(run)
    out(f"lakehouse {lakehouse.root}; working directory {workdir} (the checker's log, each client's stderr)")
    return run


def run_cases(run: Run, checker: Checker, cases: Mapping[str, Case], order: list[str], parallel: int,
              out: Out) -> list[str]:
    """Run ``cases``, at most ``parallel`` at once, started in ``order``; each case's line printed in the
    case list's order, as soon as that case and every one before it are done. The failed cases' names."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    deadlines: dict[str, Deadline] = {}
    interrupted = threading.Event()

    def judged(name: str) -> Optional[str]:
        if not checker.alive():
            return f"the checker exited; see {checker.log_path}"
        deadlines[name] = Deadline(run.case_timeout_s)  # a case's time starts when it starts, not when queued
        if interrupted.is_set():  # started as the run was interrupted
            deadlines[name].expire()
        return run_case(run, name, cases[name], deadlines[name])

    failed = []
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="conformance-case") as pool:
        verdicts = {name: pool.submit(judged, name) for name in order}
        try:
            for name in cases:
                reason = verdicts[name].result()
                out(f"PASS {name}" if reason is None else f"FAIL {name}: {reason}")
                if reason is not None:
                    failed.append(name)
        except BaseException:  # interrupted (Ctrl-C): the cases not started never start, the others end now
            interrupted.set()
            for verdict in verdicts.values():
                verdict.cancel()
            for deadline in list(deadlines.values()):
                deadline.expire()
            raise
    return failed


def run_kit(options: KitOptions, out: Out = print) -> int:
    """Run the chosen cases, ``options.parallel`` at once; 0 only if every one passed.

    Raises :class:`ConformanceKitError` if the run cannot start (no checker, unknown case).
    """
    cases = chosen_cases(options.cases, options.object_store)
    with contextlib.ExitStack() as stack:
        run = prepare(options, stack, out)
        checker = Checker(run)
        stack.callback(checker.stop)
        out(f"checker up in {checker.wait_ready():.0f} s (spark-submit, pid {checker.process.pid})")
        started = time.monotonic()
        failed = run_cases(run, checker, cases, start_order(cases), max(1, options.parallel), out)
        out(f"{len(cases) - len(failed)} of {len(cases)} cases passed in {time.monotonic() - started:.0f} s"
            + (f"; failed: {', '.join(failed)}" if failed else ""))
        return 1 if failed else 0
