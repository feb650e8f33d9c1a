"""``jobs/checker.py`` when another checker holds the lease: it stands by (exit 0 on a signal), or with
``--exit-if-running`` exits 3. Run in this process with a stand-in for Spark, which it never reaches."""

from __future__ import annotations

import importlib.util
import threading
import time

import pytest

from coordinator.checker.runtime import JobRuntime
from coordinator.checker.session import PROJECT_ROOT
from coordinator.config import CoordinatorConfig
from coordinator.control.lease import CheckerLease


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
    spec = importlib.util.spec_from_file_location("checker_job", PROJECT_ROOT / "jobs" / "checker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def start_job(app_name, parser, argv, before_spark=None):
        runtime.args = parser.parse_args(argv)
        runtime.config = CoordinatorConfig.load(runtime.args.config)
        if before_spark is not None:
            before_spark(runtime.args, runtime.config)
        runtime.spark.started = True
        return runtime

    monkeypatch.setattr(module, "start_job", start_job)
    (tmp_path / "coordinator.toml").write_text(f'lakehouse = "{tmp_path / "lakehouse"}"\n')
    CheckerLease(str(tmp_path / "lakehouse")).acquire()
    return module


@pytest.mark.parametrize("flag", ["--exit-if-running", "--recover-checkpoint"])
def test_a_start_that_would_not_stand_by_exits_3_naming_the_holder_before_starting_spark(job, runtime, tmp_path,
                                                                                           capsys, flag):
    assert job.main(["--config", str(tmp_path / "coordinator.toml"), flag]) == 3
    assert "another checker holds" in capsys.readouterr().err
    assert not runtime.spark.started


def test_a_standby_exits_0_when_asked_to_stop(job, runtime, tmp_path, capsys):
    threading.Timer(0.3, runtime.stop_requested.set).start()  # as SIGTERM does
    started = time.monotonic()
    assert job.main(["--config", str(tmp_path / "coordinator.toml")]) == 0
    assert 0.2 < time.monotonic() - started < 5  # it stood by until then, not exiting 3 at once
    assert "stopped while standing by" in capsys.readouterr().err
    assert runtime.spark.stopped
