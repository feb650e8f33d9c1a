"""txcoord as a user installs it: the wheel, built from this checkout, in a fresh virtualenv, run
from a directory outside the checkout. ``txcoord init`` writes the configuration and the tables,
``txcoord checker`` and then the documented ``spark-submit`` line run the checker, and a producer's
commit, rollback and check-back are delivered as they should be; SIGTERM, and Ctrl-C, stop the
checker with 0."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from deltalake import DeltaTable

from coordinator.lakehouse import read_table
from support import run_checked as run, user_environment
from support.console_client import signed_in

pytestmark = pytest.mark.slow

PRODUCER = '''
import json, sys, time
from pathlib import Path
from coordinator import CoordinatorConfig, LocalTransactionState, Message, TransactionListener, TransactionProducer

FATES = {b"commit": LocalTransactionState.COMMIT_MESSAGE, b"rollback": LocalTransactionState.ROLLBACK_MESSAGE,
         b"lost-end": LocalTransactionState.UNKNOW}

class Listener(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return FATES[msg.body]

    def check_local_transaction(self, msg):  # the lost END's transaction was committed locally
        return LocalTransactionState.COMMIT_MESSAGE

with TransactionProducer("install_group", Listener(), CoordinatorConfig.load("c.toml")) as producer:
    sent = {fate: producer.send_message_in_transaction(Message("INSTALL_TOPIC", fate.decode().encode())).transaction_id
            for fate in map(str.encode, sys.argv[1:])}
    print(json.dumps({fate.decode(): tid for fate, tid in sent.items()}), flush=True)
    deadline = time.monotonic() + 600
    while not Path("stop-producer").exists() and time.monotonic() < deadline:  # its check-back worker answers
        time.sleep(0.2)
'''


@pytest.fixture
def started():
    """Every process a test starts, killed with its group at the end if it is still running."""
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


class Started:
    """A process in its own process group, its output in a log file."""

    def __init__(self, argv: list[str], workdir: Path, env: dict[str, str], log: str,
                 started: list[subprocess.Popen]) -> None:
        self.log = workdir / log
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        started.append(self.process)

    def wait_for(self, condition, what: str, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.process.poll() is None, f"exited {self.process.returncode} before {what}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"no {what} after {timeout_s} s:\n{self.tail()}"
            time.sleep(0.5)

    def stop(self) -> int:
        """SIGTERM to the whole process group, as systemd sends it by default; its exit status."""
        os.killpg(self.process.pid, signal.SIGTERM)
        return self._exit_status()

    def interrupt(self) -> int:
        """SIGINT to the whole process group, as Ctrl-C in a terminal sends it; its exit status."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self._exit_status()

    def _exit_status(self) -> int:
        try:
            return self.process.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # whatever it left behind

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


def delivered(workdir: Path) -> list[str]:
    topic = workdir / "lakehouse" / "topics" / "INSTALL_TOPIC"
    if not DeltaTable.is_deltatable(str(topic)):
        return []
    return sorted(read_table(str(topic)).column("transaction_id").to_pylist())


def send(workdir: Path, env: dict[str, str], venv: Path, started: list[subprocess.Popen],
         *fates: str) -> tuple[subprocess.Popen, dict[str, str]]:
    (workdir / "stop-producer").unlink(missing_ok=True)
    producer = subprocess.Popen([str(venv / "bin" / "python"), "producer.py", *fates], cwd=workdir, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    started.append(producer)
    return producer, json.loads(producer.stdout.readline() or "{}")


def test_the_installed_package_runs_the_checker_and_delivers_from_outside_the_checkout(installed, tmp_path, started):
    workdir = tmp_path / "service"
    workdir.mkdir()
    env = user_environment(installed)
    txcoord = str(installed / "bin" / "txcoord")
    where = run([str(installed / "bin" / "python"), "-c", "import coordinator; print(coordinator.__file__)"],
                cwd=workdir, env=env).stdout
    assert where.startswith(str(installed)), where  # the wheel's package, not the checkout's
    assert run([txcoord, "--version"], cwd=workdir, env=env).stdout.startswith("txcoord ")

    assert "wrote c.toml" in run([txcoord, "init", "--config", "c.toml"], cwd=workdir, env=env).stdout
    # Short timings, so that the lost END is checked back within seconds.
    config = workdir / "c.toml"
    written = config.read_text()
    shortened = written.replace("transaction_timeout_ms = 6000", "transaction_timeout_ms = 1000").replace(
        "transaction_check_interval_ms = 60000", "transaction_check_interval_ms = 2000")
    config.write_text(shortened)
    settings = tomllib.loads(shortened)
    assert (settings["transaction_timeout_ms"], settings["transaction_check_interval_ms"]) == (1000, 2000)
    (workdir / "producer.py").write_text(PRODUCER)

    checker = Started([txcoord, "checker", "--config", "c.toml"], workdir, env, "checker.log", started)
    producer, sent = send(workdir, env, installed, started, "commit", "rollback", "lost-end")
    checker.wait_for(lambda: len(delivered(workdir)) >= 2, "commit and check-back delivered")
    assert checker.stop() == 0, checker.tail()
    (workdir / "stop-producer").touch()
    assert producer.wait(timeout=60) == 0, producer.stderr.read()
    assert delivered(workdir) == sorted([sent["commit"], sent["lost-end"]])  # never the rolled-back one
    outcomes = dict(zip(*read_table(str(workdir / "lakehouse" / "system" / "op"), ["transaction_id", "outcome"])
                        .to_pydict().values()))
    assert outcomes == {sent["commit"]: "COMMIT", sent["rollback"]: "ROLLBACK", sent["lost-end"]: "COMMIT"}
    checks = read_table(str(workdir / "lakehouse" / "system" / "check_requests"), ["transaction_id"])
    # The lost END's transaction is checked back. (So may the others be, on a loaded machine, if their END
    # was stored over the 1 s timeout after their half: their own END, stored first, still decides, as above.)
    assert sent["lost-end"] in set(checks.column("transaction_id").to_pylist())

    # The alert rules ship with the package.
    assert "alert: TxcoordNoChecker" in run([txcoord, "alert-rules"], cwd=workdir, env=env).stdout
    # So do the web console's pages: a user signs in and sees the delivered transaction's timeline.
    run([txcoord, "console-user", "add", "ops", "--role", "viewer", "--password-stdin", "--config", "c.toml"],
        cwd=workdir, env=env, input="ops-has-a-long-password\n")
    console = Started([txcoord, "console", "--config", "c.toml", "--port", "0"], workdir, env, "console.log", started)
    console.wait_for(lambda: "txcoord console: http" in console.log.read_text(), "the console's address")
    url = re.search(r"(http://\S+)/ ", console.log.read_text()).group(1)
    timeline = signed_in(url, "ops", "ops-has-a-long-password").get(f"/transactions/{sent['commit']}")
    assert timeline.status_code == 200 and "delivered" in timeline.text and "INSTALL_TOPIC" in timeline.text
    assert console.stop() == 0, console.tail()  # SIGTERM

    # The documented spark-submit line, with the job and the settings the installed package names.
    properties = run([txcoord, "spark-setup", "--properties-file"], cwd=workdir, env=env).stdout.strip()
    job = run([txcoord, "spark-setup", "--job-file", "checker"], cwd=workdir, env=env).stdout.strip()
    conf_dir = run([txcoord, "spark-setup", "--conf-dir"], cwd=workdir, env=env).stdout.strip()
    assert job.startswith(str(installed)) and Path(properties).is_file() and list(Path(conf_dir).iterdir()) == []
    submitted = Started(["spark-submit", "--properties-file", properties, job, "--config", "c.toml"], workdir,
                        {**env, "SPARK_CONF_DIR": conf_dir}, "spark-submit.log", started)
    producer, more = send(workdir, env, installed, started, "commit")
    submitted.wait_for(lambda: more["commit"] in delivered(workdir), "a commit delivered under spark-submit")
    assert submitted.interrupt() == 0, submitted.tail()  # Ctrl-C: as graceful as SIGTERM
    (workdir / "stop-producer").touch()
    assert producer.wait(timeout=60) == 0, producer.stderr.read()
    assert delivered(workdir) == sorted([sent["commit"], sent["lost-end"], more["commit"]])
