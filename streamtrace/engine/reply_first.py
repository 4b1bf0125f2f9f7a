"""When the serve loop lets a call's replies go before its update: it lives in the runner distribution
(``streamtrace_runner.reply_first``, jax-free, shared with the jax-free runner's server); this name
is that same module."""
import sys

from streamtrace_runner import reply_first as _reply_first

sys.modules[__name__] = _reply_first
