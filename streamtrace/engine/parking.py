"""The engine's parking live in the runner distribution (``streamtrace_runner.parking``, jax-free, shared
with the jax-free runner's server); this name is that same module."""
import sys

from streamtrace_runner import parking as _parking

sys.modules[__name__] = _parking
