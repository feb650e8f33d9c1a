"""The shape of the package's code: a function longer than a screen says in its docstring why it is not
split, in a sentence that starts "Long because"."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import coordinator
from coordinator import tables

MAX_LINES = 80
#: A sentence of the docstring that starts so gives the reason a function is longer than MAX_LINES.
REASON = re.compile(r"(?:^|[.:;!?]\s+|\n\s*)Long because\s+\S")


def functions_too_long_without_a_reason() -> list[str]:
    package = Path(coordinator.__file__).parent
    found = []
    for path in sorted([*package.rglob("*.py"), *Path(tables.__file__).parent.rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # from ``def`` to its last line, decorators aside
                if lines > MAX_LINES and not REASON.search(ast.get_docstring(node) or ""):
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_a_screen_without_a_reason_in_its_docstring():
    assert functions_too_long_without_a_reason() == []


def test_the_reason_is_a_sentence_of_its_own():
    assert REASON.search("Write the batch.\n\nLong because each step reads what the one before wrote.")
    assert REASON.search("Long because the steps share a transaction.")
    assert not REASON.search("Not long because of anything.")
    assert not REASON.search("Long because")  # the reason itself is missing
