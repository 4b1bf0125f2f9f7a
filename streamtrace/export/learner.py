"""The learner a serve config describes: the one place the export package reads a config file
(``engine/config.py`` owns the serve file's format) and builds its recipe (``recipe/build.py``)."""
from __future__ import annotations

from ..engine.config import ConfigError, EngineConfig, load_config
from ..recipe.build import build_learner

__all__ = ["ConfigError", "EngineConfig", "load_config", "learner_of", "learner_from_config"]


def learner_of(cfg: EngineConfig, slots: int = 1):
    """The learner ``streamtrace serve`` would run from ``cfg`` over ``slots`` slots, with the
    config's ``engine.shared_weights``.

    >>> learner_of(load_config(None)).n
    1
    """
    return build_learner(cfg, slots=slots, shared_weights=cfg.engine.shared_weights)


def learner_from_config(path, slots: int = 1):
    """(config, learner) of the TOML file ``path`` (None: the default learner); raises
    ``ConfigError`` naming a bad setting.

    >>> cfg, learner = learner_from_config(None)
    >>> cfg.model.precision, learner.n
    (64, 1)
    """
    cfg = load_config(path)
    return cfg, learner_of(cfg, slots)
