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
    """Supervised mode with options: a target comes with every ``x`` (or later, by ``label``).

    The plain name ``mode="supervised"`` is ``Supervised()``. Use the options to update the
    weights less often, or when targets arrive some steps after their inputs (a label that
    needs a human or a slow measurement).

    Parameters
    ----------
    learn_every : int, default 1
        k >= 1: the gradients of k steps are summed into one optimizer update (every step
        still learns traces and is scored).
    label_delay : int, default 0
        d >= 1: a step takes no target; it comes later through ``OnlineLearner.label`` while at
        most d - 1 later steps have run (``age`` 0..d-1). Needs ``learn_every=1``, a model that
        learns, and no transform, readout or combine (docs/labels.md).

    Examples
    --------
    >>> import streamtrace as st
    >>> st.Supervised(learn_every=4)
    Supervised(learn_every=4, label_delay=0)
    >>> st.Supervised(label_delay=3).label_delay
    3
    """
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
    """Forecast mode with options: each input is the target of the prediction made before it.

    The plain name ``mode="forecast"`` is ``Forecast()``: predict every input channel one step
    ahead. Use the options to forecast some channels from others (exogenous inputs), several
    steps ahead, or to update less often.

    Parameters
    ----------
    channels : tuple of int, optional
        The input channels to predict (distinct indices); the others are exogenous inputs.
        None (default): all of them.
    horizon : int, default 1
        How many steps ahead each step predicts: the model is run forward on its own
        predictions inside the step; learning uses the first step.
    learn_every : int, default 1
        k >= 1: the gradients of k steps are summed into one optimizer update.
    before_update : bool, default False
        Predict with the weights (model and readout) as they were before this step's update,
        from the newest input, so that the prediction does not wait for the update.

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> mode = st.Forecast(channels=[0], horizon=2)
    >>> mode
    Forecast(channels=(0,), horizon=2, learn_every=1, before_update=False)
    >>> model = st.nn.Stack("gru", n_in=2, n_hidden=4, n_out=1)
    >>> learner = st.OnlineLearner(model, np.zeros(2, np.float32), mode=mode)
    >>> learner.step(np.ones(2, np.float32)).prediction.shape    # 2 steps ahead of channel 0
    (2, 1)
    """
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
