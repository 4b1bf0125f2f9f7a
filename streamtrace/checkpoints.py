"""The checkpoint format: it lives in the jax-free runner distribution
(``streamtrace_runner.checkpoints``, ``runner/`` in this repository), which the learner, ``serve``
and the runner all write; this name is that same module (one module object)."""
import sys

from streamtrace_runner import checkpoints as _checkpoints

sys.modules[__name__] = _checkpoints
