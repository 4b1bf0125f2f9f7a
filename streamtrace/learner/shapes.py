"""The shapes a learner takes and gives: its model's input, its prediction's shape, and the
checks every call's arrays pass before a program sees them (a wrong shape is a ValueError
naming the array, and nothing runs)."""
from __future__ import annotations

import numpy as np

__all__ = ["model_input", "forecast_channels", "prediction_shape", "CallChecks"]


def model_input(example_x, transform, readout):
    """An example of the model's input: ``example_x``, widened by a transform that adds inputs
    (feedback of the readout's last prediction)."""
    if transform is None or example_x.ndim != 1:
        return example_x
    n = transform.widen(example_x.shape[0], getattr(readout, "n_out", None))
    return example_x if n == example_x.shape[0] else np.zeros(n, example_x.dtype)


def forecast_channels(spec, x_shape: tuple):
    """The input channels a ``Forecast(channels=...)`` predicts (None: all of them), checked
    against the input's shape."""
    if spec is None or spec.channels is None:
        return None
    if len(x_shape) != 1:
        raise ValueError(f"Forecast(channels=...) needs 1-D inputs; the example x has shape {x_shape}")
    bad = [c for c in spec.channels if c >= x_shape[0]]
    if bad:
        raise ValueError(f"Forecast: channels {bad} out of range for {x_shape[0]} input channels")
    return spec.channels


def prediction_shape(out, readout, mode: str, channels, x_shape: tuple):
    """One step's prediction as (shape, dtype): the model's output ``out`` (a shape/dtype
    struct), or the readout's, checked against what ``mode`` predicts."""
    want = x_shape if channels is None else (len(channels),)
    if readout is not None:
        n_out = readout.n_out or (int(np.prod(want)) if mode == "forecast" else None)
        if n_out is None:
            raise ValueError("rls readout in supervised mode: give n_out (the target size)")
        shape = (n_out,) if mode != "forecast" or channels is not None else want
        if mode == "forecast" and int(np.prod(shape)) != int(np.prod(want)):
            raise ValueError(f"forecast mode predicts {want}; the readout has n_out = {n_out}")
        return tuple(shape), np.dtype(out.dtype)
    if mode == "forecast" and tuple(out.shape) != want:
        raise ValueError(f"forecast mode predicts the next input{'' if channels is None else ' channels'}: "
                         f"the model output {tuple(out.shape)} must have shape {want}")
    return tuple(out.shape), np.dtype(out.dtype)


class CallChecks:
    """The arrays of a learner's calls, checked and converted.

    Parameters
    ----------
    slots : int or None
        The learner's slots (None: no slot axis).
    x, y : tuple
        (shape, dtype) of one slot's sample and of its prediction.
    needs_target : bool
        Whether a learning step must come with a target (supervised mode, labels not delayed).
    label_delay : int
        With delayed labels a step takes no target at all.

    Examples
    --------
    >>> import numpy as np
    >>> checks = CallChecks(2, ((3,), np.float32), ((1,), np.float32), needs_target=True, label_delay=0)
    >>> x, y = checks.inputs(np.zeros((2, 3)), np.zeros((2, 1)))
    >>> x.dtype, y.shape
    (dtype('float32'), (2, 1))
    >>> checks.mask(None).tolist()
    [True, True]
    >>> checks.inputs(np.zeros(3), np.zeros((2, 1)))
    Traceback (most recent call last):
    ...
    ValueError: x has shape (3,), expected (2, 3)
    """

    def __init__(self, slots, x, y, *, needs_target: bool, label_delay: int):
        self.slots = slots
        self.n = slots or 1
        (self.x_shape, self.x_dtype), (self.out_shape, self.y_dtype) = x, y
        self.needs_target = needs_target
        self.label_delay = label_delay
        self._ones = np.ones(self.n, bool)
        self._no_target = np.zeros((self.n,) + self.out_shape if slots else self.out_shape, self.y_dtype)

    def _shape(self, lead, n, shape):
        return lead + (() if self.slots is None else (n,)) + shape

    def inputs(self, x, y, lead=(), learning=True, n=None):
        """``x`` and the target ``y`` (zeros where none is given) as arrays of the learner's
        dtypes, for ``n`` slots (default all) and leading axes ``lead`` (a loop's steps)."""
        n = n or self.n
        x = np.asarray(x, self.x_dtype)
        if x.shape != self._shape(lead, n, self.x_shape):
            raise ValueError(f"x has shape {x.shape}, expected {self._shape(lead, n, self.x_shape)}")
        if y is None:
            if self.needs_target and learning:
                raise ValueError("supervised mode needs a target with every x (or learn=False)")
            if not lead and n == self.n:
                return x, self._no_target
            return x, np.zeros(self._shape(lead, n, self.out_shape), self.y_dtype)
        if self.label_delay:
            raise ValueError("with Supervised(label_delay=...) a step takes no target: give it later "
                             "(or at once) with label(y, age, slot)")
        y = np.asarray(y, self.y_dtype)
        if y.shape != self._shape(lead, n, self.out_shape):
            raise ValueError(f"target has shape {y.shape}, expected {self._shape(lead, n, self.out_shape)}")
        return x, y

    def mask(self, mask, lead=(), name="active", n=None):
        """A per-slot mask (``active`` or ``learn``) as bools; all true when None."""
        n = n or self.n
        if mask is None:
            return self._ones if not lead and n == self.n else np.ones(lead + (n,), bool)
        mask = np.asarray(mask, bool)
        if mask.shape != lead + (n,):
            raise ValueError(f"{name} has shape {mask.shape}, expected {lead + (n,)}")
        return mask
