"""Moved to :mod:`streamtrace.evaluation.files`; this name is kept for code that imported it from
here, with a ``DeprecationWarning``."""
import warnings

from .evaluation.files import *  # noqa: F401,F403
from .evaluation.files import __all__  # noqa: F401

warnings.warn("streamtrace.files moved to streamtrace.evaluation.files", DeprecationWarning, stacklevel=2)
