"""Algorithm choice by name, for configs and the learner."""
from __future__ import annotations

from ..etrace import D_RTRL, ES_D_RTRL, RTRL, ETraceVjpAlgorithm

__all__ = ["make_algorithm", "ALGORITHMS"]

ALGORITHMS = ("d-rtrl", "es-d-rtrl", "rtrl")


def make_algorithm(algorithm, model, example_x, *, decay=None, rank=None, signal=None) -> ETraceVjpAlgorithm:
    """``algorithm``: a name from ALGORITHMS, or a callable ``(model, example_x) -> algorithm``."""
    if callable(algorithm) and not isinstance(algorithm, str):
        algo = algorithm(model, example_x)
        if not isinstance(algo, ETraceVjpAlgorithm):
            raise TypeError(f"algorithm factory returned {type(algo).__name__}, not an ETraceVjpAlgorithm")
        return algo
    name = str(algorithm).lower().replace("_", "-")
    if name in ("es-d-rtrl", "pp-prop", "esd-rtrl"):
        if decay is None and rank is None:
            decay = 0.9
        return ES_D_RTRL(model, example_x, decay=decay, rank=rank, signal=signal)
    if decay is not None or rank is not None:
        raise ValueError(f"decay/rank apply to es-d-rtrl only, not {algorithm!r}")
    if name == "d-rtrl":
        return D_RTRL(model, example_x, signal=signal)
    if name == "rtrl":
        return RTRL(model, example_x, signal=signal)
    raise ValueError(f"unknown algorithm {algorithm!r}; use one of {ALGORITHMS} or a factory")
