"""The learner a config describes: the one place the export package reaches the config loader
and the learner builder (``engine/config.py``, ``engine/build.py``)."""
from __future__ import annotations

from ..engine.build import build_learner
from ..engine.config import ConfigError, EngineConfig, load_config

__all__ = ["ConfigError", "EngineConfig", "learner_from_config"]


def learner_from_config(path, slots: int = 1):
    """(config, learner): the learner ``streamtrace serve`` would run from the TOML file
    ``path`` (None: the default learner), over ``slots`` slots, with the config's
    ``engine.shared_weights``. Raises ``ConfigError`` naming a bad setting.

    >>> cfg, learner = learner_from_config(None)
    >>> learner.n
    1
    """
    cfg = load_config(path)
    return cfg, build_learner(cfg, slots=slots, shared_weights=cfg.engine.shared_weights)
