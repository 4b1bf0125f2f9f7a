"""How much a loss fell over a run, as the demos report it: the mean over the first steps that
have a loss against the mean over the last ones. Steps without a loss (NaN: a learner's warm-up,
a step not answered) are left out, so a short run prints numbers, never ``nan``, and no warning.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["finite_mean", "first_last", "number_or_dash"]


def finite_mean(values) -> float:
    """The mean of the finite values; NaN (without a RuntimeWarning) when there is none.

    Example: ``finite_mean([1.0, float("nan"), 3.0])`` is 2.0."""
    v = np.asarray(values, np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def first_last(losses, n: int) -> tuple[float, float]:
    """The mean of the first ``n`` losses that exist and of the last ``n`` (NaN when none exist).

    Example: ``first_last([nan, nan, 4.0, 2.0, 1.0, 1.0], 2)`` is (3.0, 1.0)."""
    v = np.asarray(losses, np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    return finite_mean(v[:n]), finite_mean(v[-n:])


def number_or_dash(value: float, spec: str) -> str:
    """``value`` formatted with ``spec``, or "-" right-aligned to the same width when it is not finite.

    Example: ``number_or_dash(float("nan"), "6.2f")`` is "     -"."""
    text = format(value, spec) if math.isfinite(value) else "-"
    width = spec.split(".")[0].lstrip("<>^")
    return text.rjust(int(width)) if width.isdigit() else text
