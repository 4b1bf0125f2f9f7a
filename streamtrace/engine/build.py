"""Moved: a learner is built from its recipe by :mod:`streamtrace.recipe.build`; this name is
kept for code that imported it from here, with a ``DeprecationWarning``."""
import warnings

from ..recipe.build import *  # noqa: F401,F403
from ..recipe.build import __all__  # noqa: F401

warnings.warn("streamtrace.engine.build moved to streamtrace.recipe.build", DeprecationWarning, stacklevel=2)
