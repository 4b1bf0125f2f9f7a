"""A learner from a config: the one place that turns ``[model]`` and ``[learning]`` into an
``OnlineLearner`` (the engine serves it, ``streamtrace evaluate`` scores it)."""
from __future__ import annotations

import numpy as np

from ..learner import OnlineLearner
from .config import ConfigError, EngineConfig, build_model, make_optimizer

__all__ = ["build_learner"]


def build_learner(cfg: EngineConfig, *, slots: int | None = None, shared_weights: bool = True) -> OnlineLearner:
    lc = cfg.learning
    model = build_model(cfg.model)
    example = np.zeros(cfg.model.n_in, np.float32)
    try:
        return OnlineLearner(
            model, example, algorithm=lc.algorithm, decay=lc.decay or None, rank=lc.rank or None,
            optimizer=make_optimizer(lc), mode=lc.mode, learn_every=lc.learn_every, slots=slots,
            shared_weights=shared_weights, clip=lc.clip or None)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError) or type(e).__name__ == "CompileError":
            raise
        raise ValueError(f"the model does not accept model.n_in = {cfg.model.n_in} inputs "
                         f"(or model.n_out = {cfg.model.n_out} does not fit it): {e}") from e
