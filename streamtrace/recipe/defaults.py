"""The default learner: what ``serve``, ``demo``, ``replay --serve``, the bridges and ``evaluate``
run when a config names no model (neither ``model.stack`` nor ``model.factory``).

Any key the config does set wins. A fixed 200-unit float64 reservoir beside a GRU-16 whose weights
learn through D-RTRL traces (SGD) from the readout's error, causal standardisation, forecasts of
the change from the last value (forecast mode), an exact RLS readout over both choosing between
two ridges and forgetting faster for a while after a detected change in its error
(``change_lam``), mixed with persistence, a running mean and, once a season of 2..59 steps is
found in the stream, a seasonal naive and a seasonal linear expert. The learned GRU made every task as
good or better than the reservoir alone, for about 1.2x its step (docs/quality.md);
``[learned] stack = ""`` turns it off.

>>> DEFAULT_LEARNER["model"]["stack"]
'reservoir'
"""
from __future__ import annotations

__all__ = ["DEFAULT_LEARNER", "fill_defaults"]

DEFAULT_LEARNER = {
    "model": {"stack": "reservoir", "n_hidden": 200, "precision": 64},
    "transform": {"normalise": True, "normalise_rate": 0.003, "residual": "forecast"},  # residual: forecasts only
    "readout": {"kind": "rls", "change_lam": 0.99},
    "learned": {"stack": "gru", "n_hidden": 16},
    "learning": {"optimizer": "frozen"},
    # the seasons detected online in 2..59 steps (a seasonal naive and a linear expert join
    # the mixture once one is found; learner/period.py); a given combine.period replaces it
    "combine": {"experts": True, "max_period": 60},
}


def fill_defaults(recipe, given: set) -> None:
    """Set :data:`DEFAULT_LEARNER`'s values on ``recipe`` where neither ``model.stack`` nor
    ``model.factory`` is among ``given`` (the ``"section.key"`` names the config set), leaving
    every given key as it is.

    Parameters
    ----------
    recipe : Recipe
        The recipe (or an engine config) to fill in place.
    given : set of str
        The keys the config file and overrides set.

    >>> from streamtrace.recipe import Recipe
    >>> r = Recipe(); fill_defaults(r, {"model.n_hidden"}); r.model.stack, r.model.n_hidden
    ('reservoir', 32)
    """
    if {"model.stack", "model.factory"} & given:
        return
    for section, values in DEFAULT_LEARNER.items():
        for key, value in values.items():
            if f"{section}.{key}" not in given and not (key == "max_period" and "combine.period" in given):
                if value == "forecast":
                    value = recipe.learning.mode == "forecast"
                setattr(getattr(recipe, section), key, value)
