"""What the learner reads in an optax optimizer: ``frozen()``, ``param_groups(...)`` and a
global-norm clip in front of either (or of ``adam``), each an optax transform.

    optimizer=st.adam(1e-3)                                           # the default
    optimizer=optax.chain(optax.clip_by_global_norm(1.0), st.adam(1e-3))
    optimizer=st.frozen()                                             # a fixed reservoir
    optimizer=st.param_groups(readout=("out.*", optax.adam(1e-2)), rest=("*", None))

The learner takes some of them apart rather than calling them as they are: a frozen model
takes no gradient at all, parameter groups are stored as a block per group, and Adam behind
a clip still updates in place (learner/adam.py). ``optax.chain`` keeps its parts only in its
closures, so they are read from there (``_chain_parts``); a chain read otherwise (another
optax's closures) is applied as it is, which is right but not in place.
"""
from __future__ import annotations

from dataclasses import dataclass

import optax

from .adam import Adam
from .groups import ParamGroups

__all__ = ["Frozen", "frozen", "OptimizerParts", "optimizer_parts"]


class Frozen(optax.GradientTransformation):
    """``optax.set_to_zero()``, which the learner reads as "the model's weights never move":
    it then takes no gradient and keeps no traces (only a readout and transforms learn)."""


def frozen() -> Frozen:
    """An optimizer that never moves the model's weights.

    Use it for a fixed model under a learned readout (a reservoir with ``rls()``): the weights
    get no trace and no update, and the learner spends no optimizer work on them. (To freeze
    only some weights, use ``param_groups`` with a group whose transform is None.)

    Returns
    -------
    optax.GradientTransformation
        Its updates are zeros (``optax.set_to_zero``).

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> learner = st.OnlineLearner(st.nn.Reservoir(1, 8), np.zeros(1, np.float32), mode="forecast",
    ...                            optimizer=st.frozen(), readout=st.rls())
    >>> before = learner.params
    >>> for t in range(3):
    ...     _ = learner.step(np.array([np.sin(t)], np.float32))
    >>> all(np.array_equal(before[k], v) for k, v in learner.params.items())
    True
    """
    inner = optax.set_to_zero()
    return Frozen(inner.init, inner.update)


@dataclass(frozen=True)
class OptimizerParts:
    """An optimizer as the learner applies it: ``base`` (an optax transform; None when frozen),
    ``groups`` (a ``ParamGroups`` in place of base) and ``clip`` (a global norm applied first)."""
    base: optax.GradientTransformation | None
    groups: ParamGroups | None = None
    clip: float | None = None

    @property
    def frozen(self) -> bool:
        return self.base is None and self.groups is None


def _cells(fn) -> dict:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    return dict(zip(code.co_freevars, cells)) if code is not None and cells else {}


def _chain_parts(opt) -> list | None:
    """The transforms of an ``optax.chain(...)``, or None for anything else. chain keeps each
    part's ``init`` and ``update`` in ``init_fns`` / ``update_fns``; a part without extra-args
    support is wrapped in a function that holds it as ``tx`` (optax.with_extra_args_support)."""
    init, update = _cells(opt.init), _cells(opt.update)
    if getattr(opt.update, "__qualname__", "") != "chain.<locals>.update_fn" or "update_fns" not in update \
            or "init_fns" not in init:
        return None
    parts = []
    for i, u in zip(init["init_fns"].cell_contents, update["update_fns"].cell_contents):
        tx = _cells(u).get("tx")
        parts.append(tx.cell_contents if tx is not None else optax.GradientTransformationExtraArgs(i, u))
    return parts


def _clip_norm(tx) -> float | None:
    """``max_norm`` of an ``optax.clip_by_global_norm(max_norm)``, else None."""
    update = getattr(tx, "update", None)
    if getattr(update, "__qualname__", "") != "clip_by_global_norm.<locals>.update_fn":
        return None
    cell = _cells(update).get("max_norm")
    return None if cell is None else cell.cell_contents


def _special(tx) -> bool:
    return isinstance(tx, (Frozen, ParamGroups))


def optimizer_parts(optimizer) -> OptimizerParts:
    """``optimizer`` taken apart (see the module): ``frozen()``, ``param_groups(...)``, any
    optax transform, and ``optax.chain(optax.clip_by_global_norm(c), x)`` with x ``adam``,
    ``frozen()`` or ``param_groups(...)``."""
    if not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError(f"optimizer must be an optax transform (st.adam(lr), st.frozen(), st.param_groups(...), "
                        f"optax.chain(...)); got {optimizer!r}")
    clip, base = None, optimizer
    parts = _chain_parts(optimizer)
    # a clip in front of what the learner applies its own way; any other chain as it is
    if parts is not None and len(parts) == 2 and _clip_norm(parts[0]) is not None \
            and isinstance(parts[1], (Adam, Frozen, ParamGroups)):
        clip, base = _clip_norm(parts[0]), parts[1]
        if not clip > 0:
            raise ValueError(f"optax.clip_by_global_norm: max_norm must be > 0; got {clip}")
    elif parts is not None and any(_special(p) for p in parts):
        raise TypeError("frozen() and param_groups(...) go alone or behind optax.clip_by_global_norm(c) in a "
                        f"chain of two; got a chain of {[type(p).__name__ for p in parts]}")
    if isinstance(base, Frozen):
        return OptimizerParts(None)      # no gradient: a clip has nothing to clip
    if isinstance(base, ParamGroups):
        return OptimizerParts(None, groups=base, clip=clip)
    return OptimizerParts(base, clip=clip)
