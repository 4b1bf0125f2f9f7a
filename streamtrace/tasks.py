"""Moved to :mod:`streamtrace.evaluation.tasks`; this name is kept for code that imported it from
here, with a ``DeprecationWarning``."""
import warnings

from .evaluation.tasks import *  # noqa: F401,F403
from .evaluation.tasks import __all__  # noqa: F401

warnings.warn("streamtrace.tasks moved to streamtrace.evaluation.tasks", DeprecationWarning, stacklevel=2)
