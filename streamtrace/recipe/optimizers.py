"""The optimizers and the change detector a recipe names, built from its sections.

>>> OPTIMIZERS
('adam', 'sgd', 'rmsprop', 'adamw', 'frozen')
"""
from __future__ import annotations

from .errors import ConfigError
from .sections import LearningConfig, ReadoutConfig

__all__ = ["OPTIMIZERS", "make_optimizer", "change_detector"]

OPTIMIZERS = ("adam", "sgd", "rmsprop", "adamw", "frozen")


def _opt(name):
    import optax

    from ..learner.adam import adam     # optax.adam, applied in place by the learner
    return {"adam": adam, "sgd": optax.sgd, "rmsprop": optax.rmsprop, "adamw": optax.adamw}[name]


def make_optimizer(cfg: LearningConfig):
    """The learner's optimizer for ``[learning]``: ``optimizer`` at ``lr``, behind a global-norm
    clip when ``clip`` > 0 (``frozen``: the weights never move).

    Parameters
    ----------
    cfg : LearningConfig
        The ``[learning]`` section (or any object with ``optimizer``, ``lr`` and ``clip``).

    >>> import optax
    >>> isinstance(make_optimizer(LearningConfig(optimizer="sgd", lr=0.1)), optax.GradientTransformation)
    True
    """
    import optax

    from ..learner.optimizers import frozen
    if cfg.optimizer == "frozen":
        return frozen()
    opt = _opt(cfg.optimizer)(cfg.lr)
    return optax.chain(optax.clip_by_global_norm(cfg.clip), opt) if cfg.clip else opt


def change_detector(ro: ReadoutConfig):
    """The readout's change detector for ``[readout] change_*``; a bad value is a ``ConfigError``.

    >>> change_detector(ReadoutConfig(change_lam=0.99)).hold
    1000
    """
    from ..learner.adaptive_forgetting import ChangeDetector, SettingError
    try:
        return ChangeDetector(ro.change_lam, threshold=ro.change_threshold, hold=ro.change_hold,
                              fast=ro.change_fast, slow=ro.change_slow)
    except SettingError as e:
        raise ConfigError(f"readout.{e.key}", e.problem) from None
