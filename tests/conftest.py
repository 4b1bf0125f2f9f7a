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


def pytest_collection_modifyitems(config, items):
    """CI runs the suites of two Pythons side by side: every test not marked slow on both, and
    each slow one on one of them (``slow_a``: with Python 3.11, ``slow_b``: with 3.12, by a
    stable hash of its file; the device tests under tests/export stay with 3.11, whose venv
    has the aarch64 runtime). ``make test`` alone runs them all."""
    import zlib
    for item in items:
        if item.get_closest_marker("slow") is None:
            continue
        path = item.nodeid.split("::")[0]
        half = "a" if path.startswith("tests/export/") or zlib.crc32(path.encode()) % 2 == 0 else "b"
        item.add_marker(getattr(pytest.mark, f"slow_{half}"))
