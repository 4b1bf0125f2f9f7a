"""A recipe from TOML (a file, a dict, or both): filled, the default learner's keys added where
the config names no model, validated.

>>> load_recipe(overrides={"model": {"stack": "gru"}}).model.stack
'gru'
>>> load_recipe().model.stack           # no model named: the default learner
'reservoir'
"""
from __future__ import annotations

from pathlib import Path

from .defaults import fill_defaults
from .quantities import QUANTITY_KEYS
from .recipe import Recipe
from .toml import fill, read_toml

__all__ = ["load_recipe", "fill_config"]


def fill_config(cfg, path: str | Path | None = None, overrides: dict | None = None, quantities=QUANTITY_KEYS):
    """Fill ``cfg`` (a ``Recipe`` or a subclass of it) from the TOML file ``path`` and then
    ``overrides``, add the default learner's keys if neither names a model, and validate.

    Parameters
    ----------
    cfg : Recipe
        Filled in place and returned.
    path : str or Path, optional
        A TOML file; None: none.
    overrides : dict, optional
        TOML-shaped tables applied after the file.
    quantities : set of str
        The keys that accept quantity strings (``"20 ms"``).
    """
    given = set()
    for data in ((read_toml(path) if path else None), overrides):
        if data:
            given |= fill(cfg, data, "", quantities)
    fill_defaults(cfg, given)
    return cfg.validate()


def load_recipe(path: str | Path | None = None, overrides: dict | None = None) -> Recipe:
    """The validated recipe of the TOML file ``path`` and the ``overrides`` tables (either may
    be None); a section the recipe does not hold (``[engine]``, ``[sockets]``) is refused: read a
    serve config with ``streamtrace.engine.config.load_config``.

    Parameters
    ----------
    path : str or Path, optional
        A TOML file of learner sections.
    overrides : dict, optional
        Tables applied after the file, e.g. ``{"model": {"n_in": 3}}``.

    Returns
    -------
    Recipe
        Raises ``ConfigError`` naming the first bad key.
    """
    return fill_config(Recipe(), path, overrides)
