"""Busy polling between close messages: it lives in the runner distribution (``streamtrace_runner.spin``,
jax-free, shared with the jax-free runner's server); this name is that same module."""
import sys

from streamtrace_runner import spin as _spin

sys.modules[__name__] = _spin
