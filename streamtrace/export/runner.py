"""Moved: the jax-free runner is :mod:`streamtrace.runtime.runner` (also shipped alone as the
``streamtrace-runner`` distribution); this name is kept for code that imported it from here."""
from ..runtime.runner import FILES, FORMAT, Runner, RunnerError, read_manifest  # noqa: F401

__all__ = ["Runner", "RunnerError", "read_manifest", "FILES", "FORMAT"]
