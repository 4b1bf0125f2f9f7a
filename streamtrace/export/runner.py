"""The jax-free runner of an exported learner: it lives in the runner distribution
(``streamtrace_runner.runtime``, ``runner/`` in this repository); this name is that same module."""
import sys

from streamtrace_runner import runtime as _runtime

sys.modules[__name__] = _runtime
