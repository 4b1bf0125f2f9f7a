"""A learner's recipe: the learner sections of a config (``[model]``, ``[reservoir]``,
``[transform]``, ``[readout]``, ``[learning]``, ``[learned]``, ``[combine]``, ``[screen]``,
``[metrics] window``, ``[stream]``), the default learner, validation, and ``build_learner``.

Below the engine: ``serve`` builds what a recipe describes, and so do ``evaluate`` and
``export``, without the engine. Reading and checking a recipe does not load jax; building one does
(``build_learner`` and ``build_model`` are imported on first use).

>>> from streamtrace.recipe import load_recipe
>>> load_recipe(overrides={"learning": {"mode": "supervised"}, "model": {"stack": "gru"}}).learning.mode
'supervised'
"""
from .defaults import DEFAULT_LEARNER
from .errors import ConfigError
from .load import load_recipe
from .recipe import Recipe

__all__ = ["Recipe", "ConfigError", "DEFAULT_LEARNER", "load_recipe", "build_learner", "build_model",
           "make_optimizer"]

_LAZY = {"build_learner": ".build", "build_model": ".build", "make_optimizer": ".optimizers"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
