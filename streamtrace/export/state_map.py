"""Checkpoint arrays <-> an exported program's buffers: it lives in the runner distribution
(``streamtrace_runner.state_map``); this name is that same module."""
import sys

from streamtrace_runner import state_map as _state_map

sys.modules[__name__] = _state_map
