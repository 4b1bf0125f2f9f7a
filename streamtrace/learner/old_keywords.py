"""The learner's keywords before its settings became values, mapped to those values for one
release, each with a DeprecationWarning that names its new form."""
from __future__ import annotations

import dataclasses
import warnings

import optax

from .adam import adam
from .algorithms import Algorithm, algorithm_named
from .modes import Forecast, Supervised
from .optimizers import Frozen, frozen
from .settings import CompileSettings, Metrics, Slots

__all__ = ["OLD_KEYWORDS", "translate", "frozen_string"]

# old keyword -> its new form (for the warning)
OLD_KEYWORDS = {
    "decay": "algorithm=st.es_d_rtrl(decay=...)", "rank": "algorithm=st.es_d_rtrl(rank=...)",
    "signal": "algorithm=st.d_rtrl(signal=...) (or es_d_rtrl / rtrl)", "lr": "optimizer=st.adam(lr)",
    "clip": "optimizer=optax.chain(optax.clip_by_global_norm(clip), st.adam(lr))",
    "learn_every": "mode=st.Supervised(learn_every=k) or st.Forecast(..., learn_every=k)",
    "shared_weights": "slots=st.Slots(n, shared=False)", "reduce": "slots=st.Slots(n, reduce=...)",
    "batch_size": "compile=st.CompileSettings(batch_size=...)", "donate": "compile=st.CompileSettings(donate=...)",
    "standalone": "compile=st.CompileSettings(standalone=...)", "window": "metrics=st.Metrics(window=...)",
}


def _warn(name):
    warnings.warn(f"OnlineLearner({name}=...) is deprecated; use {OLD_KEYWORDS[name]}", DeprecationWarning,
                  stacklevel=4)


def _conflict(old, new):
    raise TypeError(f"OnlineLearner: give {old} in {new}, not both")


def _algorithm(old, algorithm):
    if not {"decay", "rank", "signal"} & set(old):
        return algorithm
    if isinstance(algorithm, Algorithm):
        _conflict("decay/rank/signal", "the algorithm value")
    if not isinstance(algorithm, str):
        return algorithm          # a factory: these never applied to it
    return algorithm_named(algorithm, decay=old.get("decay"), rank=old.get("rank"), signal=old.get("signal"))


def _optimizer(old, optimizer):
    if optimizer is None:
        optimizer = adam(old.get("lr", 1e-3))
    clip = old.get("clip")
    if clip is None or isinstance(optimizer, Frozen):     # a frozen model has no gradient to clip
        return optimizer
    if not clip > 0:
        raise ValueError(f"clip must be > 0; got {clip}")
    return optax.chain(optax.clip_by_global_norm(clip), optimizer)


def _mode(old, mode, extra):
    if "learn_every" not in old:
        return mode
    k = old["learn_every"]
    if isinstance(mode, (Supervised, Forecast)):
        if mode.learn_every != 1:
            _conflict("learn_every", "the mode value")
        return dataclasses.replace(mode, learn_every=k)
    if mode == "supervised":
        return Supervised(learn_every=k)
    if mode == "forecast":
        return Forecast(learn_every=k)
    extra["learn_every"] = k       # "predict" (no learning) keeps it as given, for the signature
    return mode


def _slots(old, slots, extra):
    if not {"shared_weights", "reduce"} & set(old):
        return slots
    if isinstance(slots, Slots):
        _conflict("shared_weights/reduce", "slots=st.Slots(...)")
    shared, reduce = bool(old.get("shared_weights", True)), old.get("reduce", "mean")
    if slots is None:      # one stream: kept as given, for the signature
        extra.update(reduce=reduce)
        return None
    return Slots(slots, shared=shared, reduce=reduce)


def _setting(old, value, cls, names):
    given = {k: old[k] for k in names if k in old}
    if not given:
        return value
    if value is not None:
        _conflict("/".join(given), f"{cls.__name__}(...)")
    return cls(**given)


def translate(old: dict, algorithm, optimizer, mode, slots, compile, metrics):
    """The new values for ``old`` keywords (warning for each), and a dict of what only an old
    spelling can say ({"learn_every": k} in predict mode, {"reduce": r} without slots)."""
    unknown = sorted(set(old) - set(OLD_KEYWORDS))
    if unknown:
        raise TypeError(f"OnlineLearner() got an unexpected keyword argument {unknown[0]!r}")
    for name in old:
        _warn(name)
    extra = {}
    if "lr" in old and optimizer is not None:
        old = {k: v for k, v in old.items() if k != "lr"}      # as before: the optimizer's own rate
    return (_algorithm(old, algorithm), _optimizer(old, optimizer), _mode(old, mode, extra), _slots(old, slots, extra),
            _setting(old, compile, CompileSettings, ("donate", "standalone", "batch_size")),
            _setting(old, metrics, Metrics, ("window",)), extra)


def frozen_string(optimizer):
    """``optimizer="frozen"`` (the old spelling) as ``frozen()``."""
    if isinstance(optimizer, str) and optimizer == "frozen":
        warnings.warn('OnlineLearner(optimizer="frozen") is deprecated; use optimizer=st.frozen()',
                      DeprecationWarning, stacklevel=3)
        return frozen()
    return optimizer
