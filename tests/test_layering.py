"""DESIGN §9's two rules: a producer starts no JVM; the checker never imports the producer side."""

import subprocess
import sys

PRODUCER_SIDE = ("coordinator.producer", "coordinator.commit_log", "coordinator.checkback")


def loaded_modules(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_producer_side_never_imports_pyspark():
    modules = loaded_modules("from coordinator import TransactionProducer, Message, CoordinatorConfig\n"
                             "import coordinator.checkback, coordinator.commit_log")
    assert "coordinator.producer" in modules
    assert not any(m == "pyspark" or m.startswith("pyspark.") or m == "py4j" for m in modules)


def test_checker_never_imports_producer_side():
    modules = loaded_modules("import coordinator.checker, coordinator.checker.query")
    assert "coordinator.checker.batch" in modules
    assert not set(PRODUCER_SIDE) & modules
