"""The command line, as a user runs it: ``python -m coordinator ...`` in a subprocess (no JVM)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
from deltalake import DeltaTable

from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import OPERATORS_LOG_KEY, Lakehouse, read_table
from coordinator.tables import COMMIT_LOG, SYSTEM_TABLES
from support import REPO_ROOT


def txcoord(*args: str, env: dict | None = None, cwd=REPO_ROOT, input: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m coordinator *args`` (``input`` on its stdin); ``TXCOORD_*`` from the caller's environment is left out."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXCOORD_")}
    return subprocess.run([sys.executable, "-m", "coordinator", *args], capture_output=True, text=True,
                          cwd=cwd, env={**clean, **(env or {})}, timeout=120, input=input)


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "coordinator.toml"
    path.write_text(f'lakehouse = "{tmp_path / "lakehouse"}"\ntransaction_check_max = 4\n')
    return path


#: What ``txcoord init`` creates: every system table and the operators' commit log (a group's tables come with the group).
CREATED = [t.name for t in SYSTEM_TABLES] + [OPERATORS_LOG_KEY]


def test_init_creates_the_tables_then_reports_already_initialised(config_file, tmp_path):
    lakehouse = tmp_path / "lakehouse"

    first = txcoord("init", "--config", str(config_file))
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [f"created {name}" for name in CREATED] + [
        f"lakehouse {lakehouse} initialised: {len(CREATED)} table(s) created"
    ]

    second = txcoord("init", "--config", str(config_file))
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == [f"lakehouse {lakehouse} already initialised"]

    for name, table in [(t.name, t) for t in SYSTEM_TABLES] + [(OPERATORS_LOG_KEY, COMMIT_LOG)]:
        assert DeltaTable(Lakehouse(lakehouse).path(name)).version() == 0  # the second init wrote nothing
        data = read_table(Lakehouse(lakehouse).path(name))
        assert (data.column_names, data.num_rows) == (table.column_names, 0)
    assert not (lakehouse / "groups").exists()  # no group's commit log before the group is added


@pytest.mark.parametrize(
    "content, env, message",
    [
        ("lakehouse = 'lh'\ncheck_max = 3\n", {}, "unknown key(s) check_max"),
        ("lakehouse = 'lh'\ntransaction_check_max = 0\n", {}, "transaction_check_max must be at least 1, got 0"),
        ("lakehouse = 'lh'\ntransaction_timeout_ms = 'soon'\n", {}, "transaction_timeout_ms must be an integer"),
        ("lakehouse = \n", {}, "not valid TOML"),
        ("lakehouse = 'lh'\n", {"TXCOORD_TRANSACTION_CHECK_MAX": "many"}, "TXCOORD_TRANSACTION_CHECK_MAX must be an integer"),
    ],
    ids=["unknown-key", "out-of-range", "wrong-type", "not-toml", "bad-env-override"],
)
def test_bad_config_exits_2_with_the_reason(tmp_path, content, env, message):
    config = tmp_path / "bad.toml"
    config.write_text(content)

    result = txcoord("init", "--config", str(config), env=env)

    assert result.returncode == 2
    assert "configuration error" in result.stderr and message in result.stderr, result.stderr
    assert result.stdout == ""
    assert not (REPO_ROOT / "lh").exists()  # nothing was created


def test_a_missing_config_file_is_an_error_for_every_command_but_init(tmp_path):
    result = txcoord("status", "--config", str(tmp_path / "absent.toml"))
    assert result.returncode == 2
    assert f"configuration file {tmp_path / 'absent.toml'} does not exist" in result.stderr
    assert not (tmp_path / "absent.toml").exists()


def test_init_writes_a_missing_config_file_with_the_defaults_then_the_lakehouse_it_names(tmp_path):
    config = tmp_path / "etc" / "c.toml"
    result = txcoord("init", "--config", str(config), cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert f"wrote {config}" in result.stdout
    assert CoordinatorConfig.load(config) == CoordinatorConfig()  # every setting at its default, commented
    assert "# Immunity" in config.read_text()
    assert (tmp_path / "lakehouse" / "operators" / "commit_log" / "_delta_log").is_dir()  # relative to the directory
    again = txcoord("init", "--config", str(config), cwd=tmp_path)
    assert "wrote" not in again.stdout and "already initialised" in again.stdout


def test_version_is_the_installed_distributions():
    result = txcoord("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"txcoord {importlib.metadata.version('txcoord')}"


def test_demo_refuses_too_few_orders_and_a_directory_it_did_not_make(tmp_path):
    too_few = txcoord("demo", "--orders", "3", "--lakehouse", str(tmp_path / "demo"))
    assert too_few.returncode == 2
    assert "--orders: must be at least 5" in too_few.stderr
    assert not (tmp_path / "demo").exists()

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    refused = txcoord("demo", "--lakehouse", str(precious))
    assert refused.returncode == 2
    assert "refusing to wipe" in refused.stderr
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_no_subcommand_is_a_usage_error():
    result = txcoord()
    assert result.returncode == 2
    assert "usage: txcoord" in result.stderr


def test_status_and_inspect_of_a_directory_without_a_lakehouse_exit_2(tmp_path):
    config = tmp_path / "nowhere.toml"
    config.write_text(f'lakehouse = "{tmp_path / "nowhere"}"\n')
    for command in (["status"], ["inspect", "t1"]):
        result = txcoord(*command, "--config", str(config))
        assert result.returncode == 2, result.stderr
        assert f"no lakehouse at {tmp_path / 'nowhere'}" in result.stderr


def test_init_json_lists_what_it_created(config_file, tmp_path):
    first = json.loads(txcoord("init", "--config", str(config_file), "--json").stdout)
    second = json.loads(txcoord("init", "--config", str(config_file), "--json").stdout)
    assert first == {"lakehouse": str(tmp_path / "lakehouse"), "created": CREATED, "config_written": None}
    assert second["created"] == []


def test_maintain_sets_the_log_retention_and_refuses_one_that_is_not_positive(config_file, tmp_path):
    assert txcoord("init", "--config", str(config_file)).returncode == 0
    added = txcoord("add-group", "order_group", "--config", str(config_file))
    assert added.returncode == 0, added.stderr

    done = txcoord("maintain", "--config", str(config_file), "--log-retention-hours", "0.25", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["log_retention_hours"] == 0.25
    for log in ("groups/order_group/commit_log", OPERATORS_LOG_KEY):  # every commit log, the group's and the operators'
        configuration = DeltaTable(str(tmp_path / "lakehouse" / log)).metadata().configuration
        assert configuration["delta.logRetentionDuration"] == "interval 15 minutes", log

    for bad in ("0", "-1", "soon"):
        refused = txcoord("maintain", "--config", str(config_file), "--log-retention-hours", bad)
        assert refused.returncode == 2 and f"not a positive number of hours: '{bad}'" in refused.stderr, refused.stderr
