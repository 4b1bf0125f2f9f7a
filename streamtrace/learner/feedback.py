"""Targets as inputs (output feedback): in supervised mode the target of step t-1 is known when
sample t arrives, so it can be an input of step t, as in an ESN with output feedback (teacher
forcing) or an autoregressive model. The model's input is then

    z_t = [x_t, y_{t-1}, y_{t-2}, ..., y_{t-lags}]      (x_t and the targets as the earlier
                                                           transforms of a chain made them)

per slot; a slot's targets are its own, zeros before it has any, and a step that does not
learn (no target, a refused sample) leaves them as they were. The model must accept
``n_in + lags * n_out`` inputs (``OnlineLearner`` builds the algorithm with that input).
Put it last in a ``chain`` (after ``normalise()``: the targets fed back are then standardised).
"""
from __future__ import annotations

import jax.numpy as jnp

from .transforms import Transform

__all__ = ["Feedback", "feedback"]


class Feedback(Transform):
    name = "feedback"

    def __init__(self, lags: int = 1, size: int | None = None):
        if not isinstance(lags, int) or isinstance(lags, bool) or lags < 1:
            raise ValueError(f"feedback: lags must be an integer >= 1; got {lags!r}")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise ValueError(f"feedback: size (values per target) must be a positive integer; got {size!r}")
        self.lags, self.size = lags, size

    def bind(self, channels):
        if channels is not None:
            raise ValueError("feedback feeds supervised targets back as inputs: it needs supervised mode "
                             "(a forecast's input already is its last target)")
        return super().bind(channels)

    def describe(self):
        return {"kind": self.name, "lags": self.lags, "size": self.size}

    def widen(self, n_in: int, n_out: int | None) -> int:
        """The model's input size for ``n_in`` inputs and targets of ``n_out`` values."""
        size = self.size or n_out
        if size is None:
            raise ValueError("feedback: give size= (the values of one target) or use a readout with n_out")
        return n_in + self.lags * size

    def init(self, n, x_shape, y_shape):
        if len(x_shape) != 1:
            raise ValueError(f"feedback needs 1-D inputs; got x of shape {tuple(x_shape)}")
        size = 1
        for d in y_shape:
            size *= d
        if self.size is not None and self.size != size:
            raise ValueError(f"feedback: size = {self.size}, but a target has {size} values")
        return {"y": jnp.zeros((n, self.lags * size), jnp.result_type(float))}

    def encode(self, state, x):
        return jnp.concatenate([x, state["y"].astype(x.dtype)], axis=-1)

    def observe(self, state, x, y, ok):
        if y is None:
            return state
        old = state["y"]
        y = y.reshape(y.shape[0], -1).astype(old.dtype)
        new = jnp.concatenate([y, old[:, :old.shape[1] - y.shape[1]]], axis=1)
        return {"y": jnp.where(ok[:, None], new, old)}


def feedback(lags: int = 1, size: int | None = None) -> Feedback:
    """Feed the last ``lags`` supervised targets back as model inputs (output feedback).

    In supervised mode the target of step t-1 is known when sample t arrives; the model's input
    becomes ``[x_t, y_{t-1}, ..., y_{t-lags}]`` (per slot; zeros before a slot has targets),
    as in an autoregressive model or an echo-state network with output feedback. The model must
    take ``n_in + lags * n_out`` inputs. Put it last in a ``chain``.

    Parameters
    ----------
    lags : int, default 1
        How many past targets are fed back.
    size : int, optional
        The values per target, when the learner cannot take it from the readout
        (``rls(n_out)``) or the model's output.

    Returns
    -------
    Feedback

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> model = st.nn.Stack("gru", n_in=1 + 2, n_hidden=4, n_out=1)     # x and 2 past targets
    >>> learner = st.OnlineLearner(model, np.zeros(1, np.float32), transform=st.feedback(lags=2, size=1))
    >>> learner.step(np.ones(1, np.float32), np.ones(1, np.float32)).prediction.shape
    (1,)
    """
    return Feedback(lags, size)
