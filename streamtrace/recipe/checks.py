"""Range checks shared by the recipe's and the engine's validation; each failure is a
``ConfigError`` naming the key.

>>> int_range("model.n_in", 3, 1, 10)
>>> positive("learning.lr", 0.0)
Traceback (most recent call last):
...
streamtrace.recipe.errors.ConfigError: learning.lr: must be a finite number > 0; got 0.0
"""
from __future__ import annotations

import math

from .errors import ConfigError

__all__ = ["int_range", "positive", "one_of"]


def int_range(key, v, lo, hi, note=""):
    """Refuse ``v`` outside ``lo..hi`` (``note`` explains special values)."""
    if not lo <= v <= hi:
        raise ConfigError(key, f"must be in {lo}..{hi}{note}; got {v}")


def positive(key, v):
    """Refuse anything but a finite number > 0."""
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(key, f"must be a finite number > 0; got {v}")


def one_of(names) -> str:
    """``"a, b or c"``."""
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
