"""The wire protocol: it lives in the jax-free runner distribution (``streamtrace_runner.wire``,
``runner/`` in this repository), which both ``serve`` and the runner speak; this name is that
same module (one module object: its error codes, limits and helpers are defined once)."""
import sys

from streamtrace_runner import wire as _wire

sys.modules[__name__] = _wire
