"""tests/ci_once.txt names test functions that still exist (a renamed or removed test would
otherwise silently go back to running on both of CI's Pythons, or the list would rot)."""
from __future__ import annotations

import ast

from conftest import _TESTS, _run_once


def _functions(path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


def test_every_listed_test_exists():
    missing = []
    for entry in sorted(_run_once()):
        path, _, function = entry.partition("::")
        file = _TESTS.parent / path
        if not file.is_file() or function not in _functions(file):
            missing.append(entry)
    assert not missing, "tests/ci_once.txt names tests that do not exist:\n" + "\n".join(missing)


def test_the_list_is_read_without_comments():
    once = _run_once()
    assert once and all("::" in entry and not entry.startswith("#") for entry in once)
