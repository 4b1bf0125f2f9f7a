"""A learner from its recipe: the one place that turns ``[model]``, ``[reservoir]``, ``[transform]``,
``[readout]``, ``[learning]``, ``[learned]``, ``[combine]`` and ``[screen]`` into an
``OnlineLearner`` (the engine serves it, ``streamtrace evaluate`` scores it, ``streamtrace export``
compiles it)."""
from __future__ import annotations

import dataclasses
import importlib

import numpy as np

from ..learner import (Forecast, Metrics, OnlineLearner, Slots, Supervised, chain, experts, feedback, normalise,
                       param_groups, residual, rls, screen)
from ..learner.adaptive_forgetting import AdaptiveForgetting
from ..learner.algorithms import algorithm_named
from .errors import ConfigError
from .optimizers import change_detector, make_optimizer
from .recipe import Recipe
from .sections import ModelConfig, ReservoirConfig

__all__ = ["build_learner", "build_model", "set_precision"]


def build_model(cfg: ModelConfig, reservoir: ReservoirConfig | None = None):
    """The configured model: a built-in stack, a reservoir, or the user's ``module:function``.

    Parameters
    ----------
    cfg : ModelConfig
        ``[model]``: ``stack`` or ``factory``, sizes, seed.
    reservoir : ReservoirConfig, optional
        ``[reservoir]``, for ``stack = "reservoir"`` (None: its defaults).

    >>> build_model(ModelConfig(stack="gru", n_in=2, n_hidden=8, n_out=1)).__class__.__name__
    'Stack'
    """
    from ..nn import Reservoir, Rotations, Stack
    if cfg.factory:
        mod_name, _, fn_name = cfg.factory.partition(":")
        if not mod_name or not fn_name:
            raise ConfigError("model.factory", f"{cfg.factory!r}: write it as 'package.module:function'")
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise ConfigError("model.factory", f"{cfg.factory!r}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the module's own import code failed
            raise ConfigError("model.factory", f"importing {mod_name!r} raised {type(e).__name__}: {e}") from None
        if not callable(fn):
            raise ConfigError("model.factory", f"{cfg.factory!r} is not a function (type {type(fn).__name__})")
        try:
            model = fn()
        except Exception as e:  # noqa: BLE001 - the user's code: name it, no traceback
            raise ConfigError("model.factory", f"{cfg.factory}() raised {type(e).__name__}: {e}") from None
        import brainstate
        if not isinstance(model, brainstate.nn.Module):
            raise ConfigError("model.factory", f"{cfg.factory}() returned type {type(model).__name__}, "
                              "not a brainstate.nn.Module")
        return model
    if cfg.stack == "rotation":
        return Rotations(cfg.n_in, cfg.n_hidden, seed=cfg.seed)
    if cfg.stack == "reservoir":
        r = reservoir or ReservoirConfig()
        return Reservoir(cfg.n_in, cfg.n_hidden, leak=r.leak, spectral_radius=r.spectral_radius,
                         input_scaling=r.input_scaling, bias_scaling=r.bias_scaling, density=r.density,
                         seed=cfg.seed)
    return Stack(cfg.stack, cfg.n_in, cfg.n_hidden, cfg.n_out, readout=cfg.readout or None, seed=cfg.seed)


def set_precision(bits: int):
    """jax's float width for what is built next (brainstate's switch: its import resets jax's)."""
    import brainstate
    brainstate.environ.set(precision=bits)


def transform_of(cfg: Recipe):
    sg = cfg.transform
    parts = screen_of(cfg) + ([normalise(sg.normalise_warmup, sg.normalise_rate)] if sg.normalise else []) + \
        ([residual()] if sg.residual else []) + ([feedback(sg.feedback, cfg.model.n_out)] if sg.feedback else [])
    return chain(*parts) if parts else None


def readout_of(cfg: Recipe):
    ro = cfg.readout
    if ro.kind != "rls":
        return None
    n_out = cfg.model.n_out if cfg.learning.mode != "forecast" else None
    readout = rls(n_out, lam=ro.lam, delta=tuple(float(d) for d in ro.delta), use_input=ro.use_input)
    if ro.change_lam == 1.0:
        return readout
    return AdaptiveForgetting(readout, change_detector(ro))


def combine_of(cfg: Recipe):
    c = cfg.combine
    return experts(c.period or None, eta=c.eta, window=c.window, max_period=c.max_period or None) \
        if c.experts else None


def screen_of(cfg: Recipe) -> list:
    """``[screen]``: the input channels' outlier screen, the first transform ([]: off)."""
    sc = cfg.screen
    if sc.policy == "off":
        return []
    return [screen(sc.policy, threshold=sc.threshold, rate=sc.rate, ranges=sc.range or None)]


def beside_of(cfg: Recipe, model, optimizer, n_in: int):
    """``[learned]``: the model beside a trace-learned cell (``nn.Beside``), the model's weights
    under ``learning.optimizer`` (frozen for a reservoir) and the cell's under its own."""
    b = cfg.learned
    if not b.stack:
        return model, optimizer
    import jax

    from ..nn import Beside
    from ..nn.stacks import LEARNED_CELLS
    cell = LEARNED_CELLS[b.stack](n_in, b.n_hidden, key=jax.random.PRNGKey(cfg.model.seed))
    own = None if cfg.learning.optimizer == "frozen" else optimizer
    cell_opt = None if b.optimizer == "frozen" else \
        make_optimizer(dataclasses.replace(cfg.learning, optimizer=b.optimizer, lr=b.lr))
    if own is None and cell_opt is None:
        return Beside(fixed=model, learned=cell), optimizer         # all frozen
    return Beside(fixed=model, learned=cell), param_groups(fixed=("fixed.*", own), learned=("learned.*", cell_opt))


def build_learner(cfg: Recipe, *, slots: int | None = None, shared_weights: bool = True) -> OnlineLearner:
    """The ``OnlineLearner`` a validated recipe describes.

    Parameters
    ----------
    cfg : Recipe
        A validated recipe (``load_recipe``) or engine config (``engine.config.load_config``).
    slots : int, optional
        Build it over this many independent streams (``Slots``); None: one stream, no slots.
    shared_weights : bool
        With ``slots``: one set of weights for every slot (True) or one per slot.

    Returns
    -------
    OnlineLearner
        Raises ``ConfigError`` for a setting the model refuses.

    >>> import numpy as np
    >>> from streamtrace.recipe import load_recipe
    >>> learner = build_learner(load_recipe(overrides={"model": {"stack": "gru", "n_hidden": 4}}))
    >>> learner.step(np.zeros(1, np.float32)).prediction.shape
    (1,)
    """
    lc = cfg.learning
    set_precision(cfg.model.precision)
    n_model = cfg.model.n_in + cfg.transform.feedback * cfg.model.n_out      # feedback: targets are inputs too
    model = build_model(dataclasses.replace(cfg.model, n_in=n_model), cfg.reservoir)
    model, optimizer = beside_of(cfg, model, make_optimizer(lc), n_model)
    example = np.zeros(cfg.model.n_in, np.float64 if cfg.model.precision == 64 else np.float32)
    if lc.mode == "forecast":
        mode = Forecast(tuple(lc.channels) or None, lc.horizon, learn_every=lc.learn_every,
                        before_update=lc.forecast_before_update)
    else:
        mode = Supervised(learn_every=lc.learn_every, label_delay=lc.label_delay)
    try:
        return OnlineLearner(
            model, example, algorithm=algorithm_named(lc.algorithm, decay=lc.decay or None, rank=lc.rank or None),
            optimizer=optimizer, mode=mode, slots=None if slots is None else Slots(slots, shared=shared_weights),
            transform=transform_of(cfg), readout=readout_of(cfg), metrics=Metrics(cfg.metrics.window),
            combine=combine_of(cfg))
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError) or type(e).__name__ == "CompileError":
            raise
        raise ValueError(f"the model does not accept model.n_in = {cfg.model.n_in} inputs "
                         f"(or model.n_out = {cfg.model.n_out} does not fit it): {e}") from e
