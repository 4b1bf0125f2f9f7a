"""The learner's settings as values: its slots, how it is compiled, its rolling metrics."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

__all__ = ["Slots", "CompileSettings", "Metrics"]


@dataclass(frozen=True)
class Slots:
    """Many independent streams in one learner: ``n`` slots stepped in one compiled call.

    Each slot has its own hidden state, traces and scores; the weights are shared by default (one
    model learns from every stream) or per slot (a model each). ``slots=n`` is ``Slots(n)``. Use
    it to serve many sensors with one learner: one call costs far less than n calls.

    Parameters
    ----------
    n : int
        The number of slots (>= 1). Inputs then have a leading axis of length n.
    shared : bool, default True
        One model for all slots; False: every slot has its own weights and optimizer state.
    reduce : {"mean", "sum"}, default "mean"
        How the slots' losses combine into the shared model's gradient.

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> st.Slots(4, shared=False)
    Slots(n=4, shared=False, reduce='mean')
    >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    >>> learner = st.OnlineLearner(model, np.zeros(1, np.float32), slots=st.Slots(2))
    >>> learner.step(np.ones((2, 1), np.float32), np.ones((2, 1), np.float32)).loss.shape
    (2,)
    """
    n: int
    shared: bool = True
    reduce: str = "mean"

    def __post_init__(self):
        if not isinstance(self.n, numbers.Integral) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"slots must be an integer >= 1; got {self.n!r}")
        object.__setattr__(self, "n", int(self.n))
        if self.reduce not in ("mean", "sum"):
            raise ValueError(f"reduce must be 'mean' or 'sum'; got {self.reduce!r}")


@dataclass(frozen=True)
class CompileSettings:
    """How the step is compiled and its state packed. ``donate``: let XLA reuse the state's
    standalone buffers (None: where it pays, see OnlineLearner); ``standalone``: leaves of at
    least this many values cross as buffers of their own (the rest packed per dtype);
    ``batch_size``: brainstate's batch size for the model's states (None: unbatched)."""
    donate: bool | None = None
    standalone: int | None = 2048
    batch_size: int | None = None


@dataclass(frozen=True)
class Metrics:
    """The rolling prequential scores of ``OnlineLearner.stats()["metrics"]``.

    Every prediction is scored against its target before it is learnt from (prequential), and
    the MSE, MAE and NRMSE per slot are exponential averages over about the last ``window``
    steps: how well the learner does now, not since it started.

    Parameters
    ----------
    window : int, default 1000
        The averages' time constant, in steps.

    Examples
    --------
    >>> import streamtrace as st
    >>> st.Metrics(window=200).window
    200
    """
    window: int = 1000
