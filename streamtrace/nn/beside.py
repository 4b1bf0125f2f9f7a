"""Models side by side: one input, their output features concatenated.

A fixed reservoir beside a small trace-learned cell is the hybrid that does not hurt: the
readout (``streamtrace.learner.rls``) sees the reservoir's features unchanged, so learning
cannot move what the frozen model already fits, and the learned cell adds what the reservoir
misses (learned input filters, learned memory). Learning the reservoir's own recurrence under
the same readout instead moves every feature the nearly unregularised readout relies on, and
made it 27x worse on Mackey-Glass (docs/quality.md, "Learning under a readout").

Each part is an attribute named by its keyword, so its weights are named ``<part>.<weight>``
and ``param_groups(fixed=("fixed.*", None), learned=("*", adam(1e-3)))`` freezes one part.
"""
from __future__ import annotations

import brainstate
import jax.numpy as jnp

__all__ = ["Beside"]


class Beside(brainstate.nn.Module):
    """``Beside(fixed=Reservoir(1, 200), learned=GRUCell(1, 16))``: ``update(x)`` feeds x to
    every part, in keyword order, and returns their outputs concatenated on the last axis."""
    kind = "beside"

    def __init__(self, **parts):
        super().__init__()
        if len(parts) < 2:
            raise ValueError(f"Beside needs at least two models, by name; got {sorted(parts) or 'none'}")
        for name, part in parts.items():
            if not isinstance(part, brainstate.nn.Module):
                raise TypeError(f"Beside: part {name!r} is a {type(part).__name__}, not a brainstate module")
            setattr(self, name, part)
        self.names = tuple(parts)

    def update(self, x):
        return jnp.concatenate([getattr(self, n)(x) for n in self.names], axis=-1)
