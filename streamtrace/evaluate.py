"""Moved to :mod:`streamtrace.evaluation.scoring`; this name is kept for code that imported it from
here, with a ``DeprecationWarning``."""
import warnings

from .evaluation.scoring import *  # noqa: F401,F403
from .evaluation.scoring import __all__  # noqa: F401

warnings.warn("streamtrace.evaluate moved to streamtrace.evaluation.scoring", DeprecationWarning, stacklevel=2)
