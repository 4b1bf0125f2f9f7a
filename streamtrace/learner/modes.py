"""Learning modes beyond the plain names ("supervised", "forecast", "predict")."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Forecast"]


@dataclass(frozen=True)
class Forecast:
    """Forecast mode with options: ``channels`` the input channels to predict (the others are
    exogenous inputs; None: all), ``horizon`` how many steps ahead each step predicts (the
    model is run forward on its own predictions inside the step; learning uses step one)."""
    channels: tuple | None = None
    horizon: int = 1

    def __post_init__(self):
        if self.channels is not None:
            ch = tuple(int(c) for c in self.channels)
            if not ch:
                raise ValueError("Forecast: channels is empty")
            if len(set(ch)) != len(ch) or min(ch) < 0:
                raise ValueError(f"Forecast: channels must be distinct indices >= 0; got {ch}")
            object.__setattr__(self, "channels", ch)
        if not isinstance(self.horizon, int) or self.horizon < 1:
            raise ValueError(f"Forecast: horizon must be an integer >= 1; got {self.horizon!r}")
