"""Input markers: one time step, or a stacked window of steps (time on axis 0)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SingleStepData", "MultiStepData"]


@dataclass(frozen=True)
class SingleStepData:
    """An input for the current step (also fed unchanged to every step of a window)."""
    value: Any


@dataclass(frozen=True)
class MultiStepData:
    """A window of inputs: every leaf has time on axis 0; steps run in order."""
    value: Any
