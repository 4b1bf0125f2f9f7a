"""Eligibility-trace algorithms as values (``d_rtrl()``, ``es_d_rtrl(decay=0.9)``, ``rtrl()``),
and their names, for configs and as a shorthand (``algorithm="d-rtrl"``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..etrace import D_RTRL, ES_D_RTRL, RTRL, ETraceVjpAlgorithm

__all__ = ["Algorithm", "d_rtrl", "es_d_rtrl", "rtrl", "algorithm_named", "make_algorithm", "ALGORITHMS"]

ALGORITHMS = ("d-rtrl", "es-d-rtrl", "rtrl")
_ALIASES = {"pp-prop": "es-d-rtrl", "esd-rtrl": "es-d-rtrl"}


@dataclass(frozen=True)
class Algorithm:
    """An algorithm and its settings, built for a model by ``build(model, example_x)``.
    ``decay`` / ``rank``: ES-D-RTRL's trace approximation; ``signal``: the learning signal
    (None: the exact one; e.g. ``RandomFeedback``)."""
    name: str
    decay: float | None = None
    rank: int | None = None
    signal: Any = None

    def __post_init__(self):
        if self.name not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.name!r}; use one of {ALGORITHMS}")
        if self.name != "es-d-rtrl" and (self.decay is not None or self.rank is not None):
            raise ValueError(f"decay/rank apply to es-d-rtrl only, not {self.name!r}")

    def build(self, model, example_x, fixed=()) -> ETraceVjpAlgorithm:
        """``fixed``: parameter names that never change (no trace, no gradient)."""
        if self.name == "es-d-rtrl":
            return ES_D_RTRL(model, example_x, decay=self.decay, rank=self.rank, signal=self.signal, fixed=fixed)
        if self.name == "d-rtrl":
            return D_RTRL(model, example_x, signal=self.signal, fixed=fixed)
        return RTRL(model, example_x, signal=self.signal, fixed=fixed)


def d_rtrl(signal=None) -> Algorithm:
    """D-RTRL: one eligibility trace per weight (diagonal), the default algorithm.

    Each weight keeps a trace of how the hidden state depends on it, updated every step, so the
    gradient of the current loss is available online, without backpropagation through time. The
    traces cost one value per weight per slot: cheap, and exact for element-wise recurrences
    (an approximation where units are coupled through recurrent weights).

    Parameters
    ----------
    signal : optional
        The learning signal that carries the loss to the hidden state; None (default): the
        exact one, or e.g. ``st.etrace.RandomFeedback``.

    Returns
    -------
    Algorithm
        A value for ``OnlineLearner(..., algorithm=...)``.

    Examples
    --------
    >>> import streamtrace as st
    >>> st.d_rtrl()
    Algorithm(name='d-rtrl', decay=None, rank=None, signal=None)
    """
    return Algorithm("d-rtrl", signal=signal)


def es_d_rtrl(decay: float | None = None, rank: int | None = None, signal=None) -> Algorithm:
    """ES-D-RTRL (pp-prop): factored eligibility traces, one per input and one per output.

    A weight's trace is kept as the product of a decaying trace of its inputs and a trace of
    its outputs' effect on the hidden state: memory per weight grows with inputs + outputs
    instead of inputs x outputs, cheaper than ``d_rtrl`` for wide layers, at the cost of a
    further approximation (element-wise weights keep their exact trace). Use it when layers
    are wide and memory or time per slot matters.

    Parameters
    ----------
    decay : float, optional
        The input trace's decay ``a`` in [0, 1) (it sums about the last ``1 / (1 - a)``
        inputs). Give ``decay`` or ``rank``, not both; without either: 0.9.
    rank : int, optional
        The same setting as a count >= 1: ``decay = (rank - 1) / (rank + 1)``.
    signal : optional
        The learning signal; None (default): the exact one.

    Returns
    -------
    Algorithm

    Examples
    --------
    >>> import streamtrace as st
    >>> st.es_d_rtrl()
    Algorithm(name='es-d-rtrl', decay=0.9, rank=None, signal=None)
    >>> st.es_d_rtrl(rank=3).rank
    3
    """
    if decay is None and rank is None:
        decay = 0.9
    return Algorithm("es-d-rtrl", decay=decay, rank=rank, signal=signal)


def rtrl(signal=None) -> Algorithm:
    """RTRL: exact eligibility traces (costly: hidden size x weights per slot).

    Real-time recurrent learning keeps the full Jacobian of the hidden state with respect to
    every weight, so the online gradient is exact. Its memory and time grow with hidden size
    times the number of weights: use it for small models, or as the reference the
    approximations are measured against.

    Parameters
    ----------
    signal : optional
        The learning signal; None (default): the exact one.

    Returns
    -------
    Algorithm

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    >>> learner = st.OnlineLearner(model, np.zeros(1, np.float32), algorithm=st.rtrl())
    >>> learner.algo.name
    'rtrl'
    """
    return Algorithm("rtrl", signal=signal)


def algorithm_named(name: str, *, decay=None, rank=None, signal=None) -> Algorithm:
    """The algorithm called ``name`` (one of ALGORITHMS, or "pp-prop"), with its settings."""
    key = str(name).lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key == "es-d-rtrl":
        return es_d_rtrl(decay, rank, signal)
    if key not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; use one of {ALGORITHMS}, an Algorithm value or a factory")
    if decay is not None or rank is not None:
        raise ValueError(f"decay/rank apply to es-d-rtrl only, not {name!r}")
    return Algorithm(key, signal=signal)


def make_algorithm(algorithm, model, example_x, fixed=()) -> ETraceVjpAlgorithm:
    """``algorithm``: an ``Algorithm`` value, a name from ALGORITHMS, or a callable
    ``(model, example_x) -> algorithm`` (which traces every parameter: ``fixed`` applies to
    the built-in algorithms only)."""
    if isinstance(algorithm, str):
        algorithm = algorithm_named(algorithm)
    if isinstance(algorithm, Algorithm):
        return algorithm.build(model, example_x, fixed)
    if not callable(algorithm):
        raise TypeError(f"algorithm must be an Algorithm (st.d_rtrl(), st.es_d_rtrl(...), st.rtrl()), "
                        f"a name from {ALGORITHMS} or a factory (model, example_x) -> algorithm; got {algorithm!r}")
    algo = algorithm(model, example_x)
    if not isinstance(algo, ETraceVjpAlgorithm):
        raise TypeError(f"algorithm factory returned {type(algo).__name__}, not an ETraceVjpAlgorithm")
    return algo
