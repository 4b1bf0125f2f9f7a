"""The engine's settings that accept physical quantities (``"20 ms"``), beside the recipe's
(:mod:`streamtrace.recipe.quantities`, which converts them all).

>>> QUANTITY_KEYS["engine.park_s"], QUANTITY_KEYS["readout.lam"]
('seconds', 'forgetting factor')
"""
from __future__ import annotations

from ..recipe import quantities as _recipe
from ..recipe.quantities import MICROSECONDS, SECONDS, STEPS, resolve_stream, whole_steps

__all__ = ["SERVER_KEYS", "QUANTITY_KEYS", "resolve", "resolve_stream", "whole_steps"]

SERVER_KEYS = {
    "engine.idle_timeout_s": SECONDS,
    "engine.park_s": SECONDS,
    "engine.busy_poll_us": MICROSECONDS,
    "publish.weights_every": STEPS,
    "publish.stats_every_s": SECONDS,
    "checkpoint.every": STEPS,
}
# every key of a serve config that takes a quantity: the learner's and the server's
QUANTITY_KEYS = {**_recipe.QUANTITY_KEYS, **SERVER_KEYS}


def resolve(cfg) -> None:
    """Every quantity string of the engine config ``cfg`` replaced by its number (the recipe's
    keys and the server's); raises :class:`streamtrace.units.UnitError` naming the key."""
    _recipe.resolve(cfg, QUANTITY_KEYS)
