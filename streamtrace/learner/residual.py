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
    """Predict the change from the last value (forecast mode)."""
    return Residual()
