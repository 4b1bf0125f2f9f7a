"""The learner a config describes: the one place the export package reaches the config loader
and the learner builder (``engine/config.py``, ``engine/build.py``)."""
from __future__ import annotations

from ..engine.build import build_learner
from ..engine.config import ConfigError, EngineConfig, load_config

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
