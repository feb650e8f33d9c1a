"""Commands run as a user runs them: an environment without this one's settings or checkout, and a command
run to its end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["DEMO_ORDERS", "REPO_ROOT", "run_checked", "run_uv_cache_first", "user_environment", "without_txcoord_settings"]

#: The checkout the tests and benchmarks run from (its jobs/, bench/, scripts/ and notebooks/ are not in the package).
REPO_ROOT = Path(__file__).resolve().parent.parent

#: The orders of the run's one demo (the ``demo`` fixture).
DEMO_ORDERS = 12


def without_txcoord_settings() -> dict[str, str]:
    """This environment less ``TXCOORD_*``: a demo's settings, and a test's, must be its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TXCOORD_")}


def run_checked(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` to its end; fail the test with its output unless it exits 0."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{argv}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def run_uv_cache_first(*args: str) -> None:
    """``uv ARGS`` from uv's cache alone, which ``make setup`` filled, or, failing that, with the index: as the
    Makefile's setup does, and for the same reason (its comment)."""
    if subprocess.run([sys.executable, "-m", "uv", *args, "--offline"], capture_output=True, timeout=600).returncode:
        run_checked([sys.executable, "-m", "uv", *args])


def user_environment(venv: Path) -> dict[str, str]:
    """The environment of a user whose virtualenv is activated: nothing of the checkout or its tests."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("TXCOORD_", "PYSPARK_", "SPARK_", "PYTHON", "VIRTUAL_ENV"))}
    return dict(clean, PATH=f"{venv / 'bin'}{os.pathsep}{clean['PATH']}", VIRTUAL_ENV=str(venv))
