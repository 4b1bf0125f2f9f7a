"""Learning modes as values, with their options; the plain names ("supervised", "forecast",
"predict") are the modes with default options."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

__all__ = ["Supervised", "Forecast", "mode_parts", "MAX_LABEL_DELAY"]

MAX_LABEL_DELAY = 10_000


def _check_every(learn_every, where):
    if not isinstance(learn_every, numbers.Integral) or isinstance(learn_every, bool) or learn_every < 1:
        raise ValueError(f"{where}: learn_every must be an integer >= 1; got {learn_every!r}")


@dataclass(frozen=True)
class Supervised:
    """Supervised mode (a target with every x) with options: ``learn_every`` k sums k steps'
    gradients into one optimizer update; ``label_delay`` d >= 1: the target may come while at
    most d - 1 later steps have run (``age`` 0..d-1), through ``OnlineLearner.label``
    (learner/labels.py, docs/labels.md)."""
    learn_every: int = 1
    label_delay: int = 0

    def __post_init__(self):
        _check_every(self.learn_every, "Supervised")
        d = self.label_delay
        if not isinstance(d, numbers.Integral) or isinstance(d, bool) or not 0 <= d <= MAX_LABEL_DELAY:
            raise ValueError(f"Supervised: label_delay must be an integer in 0..{MAX_LABEL_DELAY}; got {d!r}")
        if d and self.learn_every != 1:
            raise ValueError("Supervised: label_delay applies each label's gradient at once; learn_every must be 1")


@dataclass(frozen=True)
class Forecast:
    """Forecast mode with options: ``channels`` the input channels to predict (the others are
    exogenous inputs; None: all), ``horizon`` how many steps ahead each step predicts (the
    model is run forward on its own predictions inside the step; learning uses step one),
    ``learn_every`` k sums k steps' gradients into one optimizer update; ``before_update``:
    predict with the weights (model and readout) as they were before this step's update
    (from the newest input), so the prediction does not wait for the update."""
    channels: tuple | None = None
    horizon: int = 1
    learn_every: int = 1
    before_update: bool = False

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
        _check_every(self.learn_every, "Forecast")
        if not isinstance(self.before_update, bool):
            raise ValueError(f"Forecast: before_update must be True or False; got {self.before_update!r}")


def mode_parts(mode) -> tuple:
    """(mode name, Forecast options or None, learn_every) of a mode value or name ("supervised",
    "forecast", "predict"; an unknown name is refused by the step, naming the modes)."""
    if isinstance(mode, Forecast):
        return "forecast", mode, mode.learn_every
    if isinstance(mode, Supervised):
        return "supervised", None, mode.learn_every
    if isinstance(mode, str) and mode == "forecast":
        return "forecast", Forecast(), 1
    return mode, None, 1
