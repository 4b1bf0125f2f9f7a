import sys
from pathlib import Path

import brainstate

# the tests live in folders by package; their shared helpers (engine_helpers, configs, paths, ...)
# here, importable from every folder
# (and the folders themselves: a test may take another's numpy oracle, e.g. test_lagged_rls.NpRLS)
_TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(_TESTS)] + sorted(str(p) for p in _TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
import pytest


@pytest.fixture
def x64():
    """float64 for gradient-correctness tests (brainstate's import resets jax's x64 flag)."""
    brainstate.environ.set(precision=64)
    yield
    brainstate.environ.set(precision=32)


@pytest.fixture(autouse=True)
def _float32_after_each_test():
    """A learner built from a config with model.precision = 64 switches jax to float64 for the
    process (as the engine and `streamtrace evaluate` want); later tests start from float32."""
    yield
    brainstate.environ.set(precision=32)


def _run_once() -> set[str]:
    """The test functions CI runs with one Python only (tests/ci_once.txt), as path::function."""
    lines = (_TESTS / "ci_once.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


# the test folders whose slow tests CI runs with Python 3.11 ("a"); the others' run with 3.12
# ("b"), and so do the files in _WITH_312 from those folders: chosen so that the two halves take
# about the same time (CI rehearsals on a 2-core machine: with learner/ and export/ whole, 3.11's
# suite 1,091 s against 3.12's 1,017 s; these two files are about 35 s). The aarch64 test's IREE
# runtime is in the clone (.cache/), for either.
_WITH_311 = {"export", "learner"}
_WITH_312 = {"tests/export/test_runner_venv.py", "tests/export/test_runner_reply_first.py"}


def pytest_collection_modifyitems(config, items):
    """CI runs the suites of two Pythons side by side: every test on both, but the slow ones and
    those listed in tests/ci_once.txt on one of them (``slow_a``: with Python 3.11, ``slow_b``:
    with 3.12, by their test folder, ``_WITH_311``). ``make test`` alone runs them all."""
    once = _run_once()
    for item in items:
        path = item.nodeid.split("::")[0]
        if item.get_closest_marker("slow") is None and item.nodeid.split("[")[0] not in once:
            continue
        folder = path.split("/")[1] if path.count("/") >= 2 else ""
        first = folder in _WITH_311 and path not in _WITH_312
        item.add_marker(pytest.mark.slow_a if first else pytest.mark.slow_b)
