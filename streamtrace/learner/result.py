"""What one step gives back to the user."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["StepResult"]


@dataclass(frozen=True)
class StepResult:
    prediction: np.ndarray   # (slots, *out) or (*out) without slots
    loss: np.ndarray         # per slot, of the prediction the user got, in user units (the model's own
                             # loss without transforms or combiner); NaN where the slot did not learn
    applied: bool | np.ndarray  # an optimizer update was applied (per slot with per-slot weights)
    outlier: bool | np.ndarray = False       # the screen found an outlier in the input (per slot with slots)
    rolled_back: bool | np.ndarray = False   # the step left a non-finite state and was undone (per slot)
