"""The examples in the docstrings run and print what they say: ``doctest`` over every module of
the installed package (streamtrace/** and adapters/**, installed as streamtrace.adapters), one
case per module, so a failing example fails the suite naming its module.

A module whose optional dependency is missing is skipped, naming the dependency. The
``__main__`` modules are left out: importing one runs the command line (they hold no example).

The examples build small learners, whose step programs are alike from one example to the next:
jax's persistent compilation cache, in a temporary folder for this file, compiles each once.
"""
from __future__ import annotations

import doctest
import importlib
import io

import pytest

from test_code_shape import _modules

MODULES = _modules()
NAMES = sorted(name for name in MODULES if name.rpartition(".")[2] != "__main__")


@pytest.fixture(scope="module", autouse=True)
def _compile_cache(tmp_path_factory):
    from streamtrace.engine import compile_cache
    compile_cache.enable(tmp_path_factory.mktemp("jax-cache"))
    yield
    compile_cache.disable()


@pytest.fixture(scope="module", autouse=True)
def _one_export_each(tmp_path_factory):
    """The runner's examples each export the default learner (IREE compiles it: about 10 s); here
    each (config, target, slots) is compiled once and its folder copied for the next example."""
    import shutil

    from streamtrace.export import write
    real, done = write.export_learner, {}

    def export_once(config, out, target="host", slots=1):
        key = (str(config), target, slots)
        if key not in done:
            folder = tmp_path_factory.mktemp("export")
            done[key] = (folder, real(config, folder, target, slots))
        shutil.copytree(done[key][0], out, dirs_exist_ok=True)
        return done[key][1]
    write.export_learner = export_once
    yield
    write.export_learner = real


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and not e.name.startswith("streamtrace"):
            pytest.skip(f"{name} needs the optional dependency {e.name!r}, not installed")
        raise


def run_doctests(module) -> tuple[int, int, str]:
    """(examples tried, examples failed, the failure report) for ``module``'s docstrings."""
    out = io.StringIO()
    runner = doctest.DocTestRunner(verbose=False)
    for test in doctest.DocTestFinder().find(module, module.__name__):
        runner.run(test, out=out.write)
    tried_failed = runner.summarize(verbose=False)
    return tried_failed.attempted, tried_failed.failed, out.getvalue()


def test_every_module_is_listed():
    assert "streamtrace.learner.online" in NAMES and "streamtrace.adapters" in NAMES
    assert all(name.startswith("streamtrace") for name in NAMES)
    for name in set(MODULES) - set(NAMES):     # left out: they must hold no example
        assert ">>>" not in MODULES[name].read_text(), name


def test_the_runner_sees_a_failing_example():
    import types
    bad = types.ModuleType("bad")
    bad.__doc__ = ">>> 1 + 1\n3\n"
    tried, failed, report = run_doctests(bad)
    assert (tried, failed) == (1, 1) and "Expected:\n    3\nGot:\n    2" in report


@pytest.mark.parametrize("name", NAMES)
def test_docstring_examples(name):
    module = _import(name)
    if module.__name__ != name:         # another name of a module (streamtrace.export.runner): run once, there
        assert module.__name__ in NAMES
        return
    tried, failed, report = run_doctests(module)
    assert failed == 0, f"{failed} of {tried} examples in {name} failed:\n{report}"
