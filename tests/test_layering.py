"""The package's layers (docs/design.md#layers and docs/layout.md): who may import whom, and which
parts start no JVM. The floors are checked in the source, every import of it; what a part loads, in a
fresh interpreter, so nothing this suite has already imported can hide a violation."""

from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import coordinator
from coordinator import exceptions, tables

PACKAGE_DIR = Path(coordinator.__file__).parent
SPARK_MODULES = ("pyspark", "py4j", "delta")


def modules_of(package: str) -> list[str]:
    """Every module of ``package`` (a sub-package of coordinator), by name."""
    return [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(PACKAGE_DIR / package.split(".", 1)[1])])]


def loaded_after(code: str) -> set[str]:
    """The modules loaded by a fresh interpreter once it has run ``code``."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return set(out.split())


def spark_loaded(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in SPARK_MODULES)


#: The package's floors, lowest first (docs/design.md#layers). A module may import its own part and the
#: parts on lower floors: never a part on its own floor (the producer side and the checker never import
#: each other, nor the jobs and the console) nor one above.
FLOORS = (
    ("shared",),
    ("control",),
    ("spark",),
    ("producer", "checker", "consumer"),
    ("ops",),
    ("jobs", "web", "conformance"),
    ("demo",),
    ("cli",),
    ("front doors",),
)
#: The vocabulary and shared plumbing: the top-level modules and packages of the first floor.
SHARED = {"appender", "commit_logs", "config", "doorbells", "durations", "exceptions", "grants", "lakehouse", "logs",
          "names", "protocol", "resources", "retries", "schedule", "storage", "tables", "validation"}
FLOOR_OF = {part: number for number, parts in enumerate(FLOORS) for part in parts}


def part_of(module: str) -> str:
    """The part of the package ``module`` (``coordinator.…``) belongs to: a name in :data:`FLOORS`."""
    if module in ("coordinator", "coordinator.__main__"):
        return "front doors"  # the producer's names re-exported, and ``python -m coordinator``
    top = module.split(".")[1]
    return "shared" if top in SHARED else top


def package_modules() -> dict[str, Path]:
    """Every module of the package (its table definitions, installed as ``coordinator.tables``, included), by name."""
    tables_dir = Path(tables.__file__).parent
    files = {path: ("coordinator", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
             for path in PACKAGE_DIR.rglob("*.py")}
    files |= {path: ("coordinator", "tables", *path.relative_to(tables_dir).with_suffix("").parts)
              for path in tables_dir.rglob("*.py")}
    return {".".join(parts[:-1] if parts[-1] == "__init__" else parts): path for path, parts in files.items()}


def package_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules a file imports, anywhere in it: ``from a import b`` is ``a.b`` when that is a
    module, else ``a``."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                         for alias in node.names}
    return {name for name in imported if name.split(".")[0] == "coordinator"}


def test_every_module_of_the_package_is_on_a_floor():
    unplaced = sorted({part_of(module) for module in package_modules()} - set(FLOOR_OF))
    assert unplaced == [], "place each in FLOORS and in docs/design.md#layers"


def test_no_import_runs_up_the_floors_or_across_one():
    """Checked in the source, so an import inside a function, made only when it runs, counts too."""
    modules = package_modules()
    wrong = []
    for module, path in sorted(modules.items()):
        importer = part_of(module)
        for imported in sorted(package_imports(path, modules)):
            target = part_of(imported)
            if target != importer and FLOOR_OF[target] >= FLOOR_OF[importer]:
                wrong.append(f"{module} ({importer}) imports {imported} ({target})")
    assert wrong == []


#: The conformance kit's own floors, lowest first (coordinator/conformance/__init__.py): a module of the kit
#: imports only the kit's modules on lower floors, so its imports go one way. The Python driver stands apart.
KIT_FLOORS = (
    ("client", "observed", "raw_log", "loopback", "faults"),
    ("primitives", "versitygw"),
    ("basic", "malformed", "checkpointed", "numbering", "grant", "storage_faults", "versioning"),
    ("cases", "object_store"),
    ("kit",),
)
KIT_APART = ("python_client",)


def test_the_kits_imports_go_one_way_and_its_python_driver_stands_apart():
    modules = package_modules()
    kit = {name.rsplit(".", 1)[1]: path for name, path in modules.items() if name.startswith("coordinator.conformance.")}
    floor_of = {module: number for number, names in enumerate(KIT_FLOORS) for module in names}
    assert sorted(kit) == sorted([*floor_of, *KIT_APART]), "place each in KIT_FLOORS and in coordinator/conformance"
    wrong = []
    for module, path in sorted(kit.items()):
        for imported in sorted(package_imports(path, modules)):
            target = imported.removeprefix("coordinator.conformance.")
            if target == imported or target == module:
                continue
            if module in KIT_APART or target in KIT_APART or floor_of[target] >= floor_of[module]:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_the_kits_s3_server_is_built_with_the_standard_library_alone():
    """``make test`` builds it (and installs Azurite, whose server is a LoopbackServer) before the checkout's
    virtual environment exists: importing its modules must load nothing but Python's own and txcoord's."""
    before = loaded_after("")
    loaded = loaded_after("import coordinator.conformance.versitygw, coordinator.conformance.loopback") - before
    assert "coordinator.conformance.versitygw" in loaded
    assert sorted({m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"coordinator"}) == []


def test_producer_side_never_imports_pyspark():
    modules = loaded_after("from coordinator import TransactionProducer, Message, CoordinatorConfig\n"
                           + "".join(f"import {m}\n" for m in modules_of("coordinator.producer")))
    assert "coordinator.producer.checkback" in modules
    assert spark_loaded(modules) == []
    assert not any(m.startswith(("coordinator.checker", "coordinator.ops", "coordinator.demo")) for m in modules)


def test_consumer_side_never_imports_pyspark_nor_the_checker_or_operator_tools():
    modules = loaded_after("from coordinator import TopicConsumer, MessageListener, ConsumeResult, CoordinatorConfig\n"
                           + "".join(f"import {m}\n" for m in modules_of("coordinator.consumer")))
    assert "coordinator.consumer.consumer" in modules
    assert spark_loaded(modules) == []
    assert not any(m.startswith(("coordinator.checker", "coordinator.ops", "coordinator.cli", "coordinator.web",
                                 "coordinator.demo")) for m in modules)


def test_checker_never_imports_producer_side_or_operator_tools():
    modules = loaded_after("".join(f"import {m}\n" for m in modules_of("coordinator.checker")))
    assert "coordinator.checker.query" in modules and "pyspark" in modules
    assert not any(m.startswith(("coordinator.producer", "coordinator.consumer", "coordinator.ops", "coordinator.cli",
                                 "coordinator.demo", "coordinator.web")) for m in modules)


def test_the_web_console_starts_no_jvm_and_only_the_console_extra_brings_its_framework():
    modules = loaded_after("".join(f"import {m}\n" for m in modules_of("coordinator.web")))
    assert "flask" in modules and "waitress" in modules
    assert spark_loaded(modules) == []
    base = loaded_after("import coordinator, coordinator.cli, coordinator.ops.status")
    assert not {"flask", "waitress", "matplotlib"} & base
    project = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())["project"]
    assert {re.split(r"[=<>!~\[ ;]", r, maxsplit=1)[0].lower() for r in project["optional-dependencies"]["console"]} == {
        "flask", "flask-wtf", "flask-login", "waitress", "tomli-w", "matplotlib"}


def test_shared_modules_belong_to_no_side():
    shared = ["coordinator.protocol", "coordinator.config", "coordinator.grants", "coordinator.lakehouse",
              "coordinator.appender", "coordinator.exceptions", "coordinator.logs", "coordinator.tables",
              *modules_of("coordinator.control")]
    modules = loaded_after("".join(f"import {m}\n" for m in shared))
    assert "coordinator.control.lease" in modules
    assert spark_loaded(modules) == []
    assert not any(m.startswith(("coordinator.producer", "coordinator.checker", "coordinator.ops", "coordinator.cli"))
                   for m in modules)


def test_operator_tools_start_no_jvm(tmp_path):
    """Every JVM-free ``txcoord`` command runs, and pyspark is never imported."""
    config = tmp_path / "coordinator.toml"
    config.write_text(f"lakehouse = '{tmp_path / 'lakehouse'}'\n")
    script = (
        "import sys\n"
        "from coordinator.cli import main\n"
        "codes = [main([*command, '--config', sys.argv[1]]) for command in "
        "[['init'], ['status'], ['inspect', 'no-such-transaction'], ['maintain']]]\n"
        + "".join(f"import {m}\n" for m in modules_of("coordinator.ops") + modules_of("coordinator.cli"))
        + "print(codes)\n"
    )
    result = subprocess.run([sys.executable, "-c", script + "print(' '.join(sys.modules))", str(config)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    codes, modules = result.stdout.splitlines()[-2:]
    assert codes == "[0, 1, 1, 0]"  # status: no checker alive; inspect: no table knows the id
    assert spark_loaded(set(modules.split())) == []


def test_the_wheel_lists_every_package():
    """A package missing from pyproject's list is missing from the wheel: found by users, not by a checkout."""
    listed = set(tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(path.parent.relative_to(PACKAGE_DIR.parent).parts) for path in PACKAGE_DIR.rglob("__init__.py")}
    assert found | {"coordinator.tables"} == listed


def test_product_never_imports_the_demo():
    for path in PACKAGE_DIR.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if module.startswith(("coordinator.demo", "coordinator.cli")):
            continue  # the demo itself, and the `txcoord demo` command that starts it
        imported = {node.module for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module}
        assert not any(m.startswith("coordinator.demo") for m in imported), module


def imports_of(path: Path) -> set[str]:
    """The modules a file imports, anywhere in it (``from a import b`` as ``a`` and ``a.b``)."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return imported


def test_tests_and_benchmarks_share_one_home_of_support_and_never_import_each_other():
    """Test support has one home, ``support/`` (its fixtures the plugin ``support.fixtures``), which ``tests/``,
    ``bench/`` (the benchmarks, the chaos harness and their own tests) and ``scripts/`` import: ``tests/``
    imports nothing of ``bench``, ``bench/`` nothing of ``tests``, and ``support/`` neither."""
    root = PACKAGE_DIR.parent
    trees = {"tests": {"bench"}, "bench": {"tests"}, "support": {"bench", "tests"}, "scripts": {"bench", "tests"}}
    for tree, forbidden in trees.items():
        files = list((root / tree).rglob("*.py"))
        assert files, tree
        for path in files:
            imported = imports_of(path)
            assert not {m.split(".")[0] for m in imported} & forbidden, path.relative_to(root).as_posix()


def test_test_support_loads_neither_the_product_nor_pytest():
    # The modules that do load them (support.batches, support.lakehouse, ...) are imported by name.
    modules = loaded_after("import support")
    assert not {m.split(".")[0] for m in modules} & {"coordinator", "pyarrow", "deltalake", "pytest", *SPARK_MODULES}


@pytest.mark.parametrize("name", [n for n, v in vars(exceptions).items() if isinstance(v, type) and issubclass(v, Exception)])
def test_every_error_derives_from_the_base_error(name):
    assert issubclass(getattr(exceptions, name), exceptions.CoordinatorError)


def test_the_product_raises_only_its_own_errors():
    """No ``raise ValueError(...)`` and the like: a caller catches ``CoordinatorError`` and gets everything."""
    # Besides its own: exiting, an abstract method, and a module's __getattr__ saying a name is not there.
    own = {n for n, v in vars(exceptions).items() if isinstance(v, type)} | {"SystemExit", "NotImplementedError",
                                                                             "AttributeError"}
    raised = []
    for path in [*PACKAGE_DIR.rglob("*.py"), *Path(tables.__file__).parent.rglob("*.py")]:
        if path.parent.name == "demo":
            continue  # the demo's order service raises its own business errors, as any service would
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                if node.exc.func.id not in own:
                    raised.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno} raises {node.exc.func.id}")
    assert raised == []


def test_the_base_install_brings_no_spark_and_the_spark_extra_brings_the_checkers():
    """`pip install txcoord` is producers, check-back and operator tools; `txcoord[spark]` adds the checker."""
    project = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[=<>!~\[ ;]", requirement, maxsplit=1)[0].lower() for requirement in requirements}

    assert names(project["dependencies"]) == {"deltalake", "pyarrow", "obstore", "rich", "platformdirs", "stamina"}
    assert names(project["optional-dependencies"]["spark"]) == {"pyspark", "delta-spark", "prometheus-client"}
    # Ranges, as a library declares them (requirements.lock pins the tested versions): never one exact version.
    assert not [r for r in project["dependencies"] + project["optional-dependencies"]["spark"] if "==" in r]


def test_the_checkers_python_workers_import_no_pandas_and_no_retry_library():
    # Spark starts a Python worker for the streaming source, for each read's planning, and the read-ahead
    # worker; pandas (brought by pyarrow.dataset) and stamina and tenacity (brought by coordinator.retries)
    # lengthened each one's start (docs/performance-log.md#figures-quoted-elsewhere-before), and the source's
    # workers make no storage request.
    modules = loaded_after("import coordinator.checker.source, coordinator.checker.readahead")
    assert "coordinator.checker.segment" in modules and "coordinator.retries" in modules
    assert "pandas" not in modules and "pyarrow.dataset" not in modules
    assert "stamina" not in modules and "tenacity" not in modules


def test_the_read_ahead_reads_a_new_log_without_importing_pandas(tmp_path):
    # A commit that adds no records (the log's creation, a writer's compaction) was read as Schema.empty_table(),
    # which imports pandas: in the read-ahead worker that was inside its first read of a backlog.
    from coordinator.lakehouse import Lakehouse, init_lakehouse
    from coordinator.producer.commit_log import CommitLogWriter, end_record
    from coordinator.protocol import LocalTransactionState

    lakehouse = Lakehouse(str(tmp_path))
    init_lakehouse(lakehouse)
    with CommitLogWriter(lakehouse, "g") as writer:
        writer.submit([end_record("g", "t1", LocalTransactionState.COMMIT_MESSAGE)]).result(timeout=60)
    modules = loaded_after(f"""
from coordinator.checker.readahead import _read_after

rows, index = _read_after({lakehouse.root!r}, {{}}, {{}}, 10)
assert [entry[1] for entry in index if entry[0] == "groups/g/commit_log"] == [0, 1] and rows.num_rows == 1
""")
    assert "coordinator.checker.readahead" in modules and "pandas" not in modules


def test_the_sources_rows_reach_spark_without_importing_pandas(tmp_path):
    # pyarrow imports pandas at its first conversion of Python objects (pa.array): in the source's runner
    # that was a second of every checker's first micro-batch, until the source built its row from bytes.
    modules = loaded_after(f"""
import json
from pyspark.sql.types import StringType, StructField, StructType
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches
from coordinator.checker.source import CommitLogSource

source = CommitLogSource({{"path": {str(tmp_path)!r}}})
reader = source.simpleStreamReader(None)
rows, end = reader.read(reader.initialOffset())  # no commit yet: a clock tick
(batch,) = records_to_arrow_batches(rows, 1000, StructType([StructField("segment", StringType())]), source)
assert json.loads(batch.column(0)[0].as_py())["clock_us"] == end["clock_us"] > 0
""")
    assert "coordinator.checker.source" in modules and "pandas" not in modules
