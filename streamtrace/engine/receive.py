"""Reading one message off a socket: it lives in the runner distribution
(``streamtrace_runner.receive``), which ``serve`` and the runner share; this name is that same module."""
import sys

from streamtrace_runner import receive as _receive

sys.modules[__name__] = _receive
