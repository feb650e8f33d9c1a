"""The checker job (``txcoord checker``, ``jobs/checker.py``) when another checker holds the lease: it
stands by (exit 0 on a signal), or with ``--exit-if-running`` exits 3. Run in this process with a
stand-in for Spark, which it never reaches."""

from __future__ import annotations

import threading
import time

import pytest

from coordinator.cli import main as txcoord
from coordinator.config import CoordinatorConfig
from coordinator.control.lease import CheckerLease
from coordinator.jobs import checker
from coordinator.jobs.runtime import JobRuntime


class AnyCall:
    """Takes any attribute and any call, and does nothing: the stream is resolved before the lease is taken."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self


class NoSpark(AnyCall):
    started = stopped = False

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def runtime() -> JobRuntime:
    return JobRuntime(args=None, config=None, spark=NoSpark(), stop_requested=threading.Event())


@pytest.fixture
def job(tmp_path, monkeypatch, runtime):
    """The checker job module, whose ``start_job`` parses the real arguments but starts no Spark,
    on a lakehouse whose lease this process holds."""
    def start_job(app_name, args, prog, before_spark=None):
        runtime.args = args
        runtime.config = CoordinatorConfig.load(runtime.args.config)
        if before_spark is not None:
            before_spark(runtime.args, runtime.config)
        runtime.spark.started = True
        return runtime

    monkeypatch.setattr(checker, "start_job", start_job)
    (tmp_path / "coordinator.toml").write_text(f'lakehouse = "{tmp_path / "lakehouse"}"\n')
    CheckerLease(str(tmp_path / "lakehouse"), ttl_s=120).acquire()  # lapses in no test: only a stop ends a standby
    return checker


@pytest.mark.parametrize("flag", ["--exit-if-running", "--recover-checkpoint"])
@pytest.mark.parametrize("entry", ["job", "txcoord checker"])
def test_a_start_that_would_not_stand_by_exits_3_naming_the_holder_before_starting_spark(job, runtime, tmp_path,
                                                                                           capsys, flag, entry):
    arguments = ["--config", str(tmp_path / "coordinator.toml"), flag]
    code = job.main(arguments) if entry == "job" else txcoord(["checker", *arguments])
    assert code == 3
    assert "another checker holds" in capsys.readouterr().err
    assert not runtime.spark.started


@pytest.mark.parametrize("entry", ["job", "txcoord checker"])
def test_a_bad_configuration_exits_2_with_the_reason_before_starting_spark(tmp_path, capsys, entry):
    (tmp_path / "bad.toml").write_text("transaction_check_max = 0\n")
    with pytest.raises(SystemExit) as exit_:  # the real start_job: it never reaches Spark
        checker.main(["--config", str(tmp_path / "bad.toml")]) if entry == "job" else txcoord(
            ["checker", "--config", str(tmp_path / "bad.toml")])
    assert exit_.value.code == 2
    assert "transaction_check_max must be at least 1" in capsys.readouterr().err


def test_a_standby_exits_0_when_asked_to_stop(job, runtime, tmp_path, capsys):
    threading.Timer(0.3, runtime.stop_requested.set).start()  # as SIGTERM does
    started = time.monotonic()
    assert job.main(["--config", str(tmp_path / "coordinator.toml")]) == 0
    # It stood by until then, not exiting 3 at once; and the stop ended it, not the lease lapsing (120 s).
    assert 0.2 < time.monotonic() - started < 60
    assert "stopped while standing by" in capsys.readouterr().err
    assert runtime.spark.stopped
