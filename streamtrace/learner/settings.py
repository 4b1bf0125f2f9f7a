"""The learner's settings as values: its slots, how it is compiled, its rolling metrics."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

__all__ = ["Slots", "CompileSettings", "Metrics"]


@dataclass(frozen=True)
class Slots:
    """``n`` streams stepped in one call, each with its own hidden state and traces.
    ``shared``: one model for all of them (else a model each); ``reduce``: how the slots'
    losses combine into the shared model's gradient ("mean" or "sum")."""
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
    """The rolling prequential metrics of ``stats()["metrics"]``: time constant ``window`` steps."""
    window: int = 1000
