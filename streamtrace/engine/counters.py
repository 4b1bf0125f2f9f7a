"""The engine's counters live in the runner distribution (``streamtrace_runner.counters``, jax-free, shared
with the jax-free runner's server); this name is that same module."""
import sys

from streamtrace_runner import counters as _counters

sys.modules[__name__] = _counters
