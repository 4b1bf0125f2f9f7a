"""Residual forecasting: the model predicts the change of the forecast channels from their
last value, ``y_{t+1} - x_t``, and the prediction is ``x_t`` plus that change. Slowly varying
signals then ask the model for a small correction instead of the whole level, and a model
that has learned nothing yet predicts persistence ("the next value equals the last")."""
from __future__ import annotations

from .transforms import Transform

__all__ = ["Residual", "residual"]


class Residual(Transform):
    name = "residual"

    def bind(self, channels):
        if channels is None:
            raise ValueError("residual forecasting needs forecast mode (the target is a future input)")
        return super().bind(channels)

    def _last(self, x):
        return x[..., self.channels]

    def target(self, state, x, y):
        return y - self._last(x).astype(y.dtype)

    def decode(self, state, x, y):
        return y + self._last(x).astype(y.dtype)


def residual() -> Residual:
    """Residual forecasting: the model predicts the change from the last value.

    The prediction is the last value of each forecast channel plus the model's output, so a
    slowly varying signal asks the model for a small correction instead of the whole level, and
    a model that has learnt nothing predicts persistence. Forecast mode only.

    Returns
    -------
    Residual

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    >>> learner = st.OnlineLearner(model, np.zeros(1, np.float32), mode="forecast",
    ...                            transform=st.residual())
    >>> r = learner.step(np.array([50.0], np.float32))
    >>> bool(abs(r.prediction[0] - 50.0) < 1)        # about the last value
    True
    """
    return Residual()
