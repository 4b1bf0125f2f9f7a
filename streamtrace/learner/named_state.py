"""A learner's state read and written by name.

The compiled programs see the state as a few packed buffers (``packing.Layout``); users,
checkpoints, the weights snapshots and the engine's stats see it as ``{readable name: numpy
array}``. ``NamedState`` turns one into the other for one learner's layout, and reads the
views made of it: the weights, what a prediction is made from, and the counters and scores.
It holds no state of its own: every reader takes the buffers it reads.
"""
from __future__ import annotations

import jax
import numpy as np

from .step import COUNTERS

__all__ = ["NamedState", "PREDICTING", "NOT_PREDICTING"]

PREDICTING = ("readout.", "signal.", "combine.")      # state entries a prediction is made from
NOT_PREDICTING = ("readout.P",)                      # ... but for what the readout learns with


class NamedState:
    """Names for one learner's packed state.

    Parameters
    ----------
    layout : packing.Layout
        How the state tree is packed into buffers.
    store : object
        The weight store of the learner's step functions (``StepFunctions.store``): where the
        weights sit in a packed weight block, and how to unpack them.
    rolling : object
        The rolling prequential metrics (``StepFunctions.rolling``), which summarise their
        own statistics.
    n : int
        The number of slots (1 without slots).
    per_slot : bool
        Whether every slot has weights of its own (a slot axis first on every weight).
    combine : Experts, optional
        The learner's experts' mixture: with a season (set or detected) ``stats`` reports the
        seasons it uses.

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    >>> L = st.OnlineLearner(model, np.zeros(1, np.float32))
    >>> names = L.names
    >>> named = names.state_dict(L.buffers)
    >>> named["params.cell.n.W"].shape
    (5, 4)
    >>> buffers = names.buffers(named)          # and back again
    >>> all(np.array_equal(a, b) for a, b in zip(buffers, L.buffers))
    True
    """

    def __init__(self, layout, store, rolling, n: int, per_slot: bool, combine=None):
        self.combine = combine if getattr(combine, "period", None) else None
        self.layout = layout
        self.store = store
        self.rolling = rolling
        self.n = n
        self.per_slot = per_slot
        self._signature = None

    # ---- whole state ------------------------------------------------------------------
    def state_dict(self, buffers) -> dict:
        """The whole state in ``buffers`` as ``{name: numpy array}``, a packed weight block and
        the optimizer state over it split back into one entry per weight."""
        return self.expand(self.layout.to_named(buffers))

    def buffers(self, named: dict) -> tuple:
        """The buffers of a ``state_dict``; a KeyError (a name missing) or ValueError (a shape
        that does not fit) if it is not a state of this layout."""
        compact = self.collapse(named)
        missing = set(self.layout.names) - set(compact)
        if missing:
            raise KeyError(f"state is missing {sorted(missing)[:5]}")
        for name, shape, _ in self.layout.entries():
            if tuple(np.shape(compact[name])) != shape:
                raise ValueError(f"state '{name}' has shape {np.shape(compact[name])}, expected {shape}")
        return self.layout.from_named(compact)

    def expand(self, named: dict) -> dict:
        """``named`` with every packed weight block split into ``{block}.{weight}`` entries."""
        out = {}
        for name, v in named.items():
            found = self.store.block_of(name, np.shape(v))
            if found is None:
                out[name] = v
                continue
            placed = found[1]
            lead = v.shape[:-2]
            flat = v.reshape(lead + (-1,))
            for part in placed.slots:
                start = placed.offset(part)
                out[f"{name}.{part.name}"] = flat[..., start:start + part.size].reshape(lead + part.shape)
        return out

    def collapse(self, named: dict) -> dict:
        """The inverse of ``expand``: per-weight entries packed back into their blocks (a name
        already packed is kept as given)."""
        out = {}
        for name, shape, dtype in self.layout.entries():
            found = self.store.block_of(name, shape)
            if name in named:
                out[name] = named[name]
            elif found is not None and all(f"{name}.{p.name}" in named for p in found[1].slots):
                placed = found[1]
                lead = shape[:-2]
                flat = np.zeros(lead + (int(np.prod(shape[-2:])),), dtype)
                for part in placed.slots:
                    start = placed.offset(part)
                    flat[..., start:start + part.size] = np.asarray(named[f"{name}.{part.name}"]).reshape(lead + (-1,))
                out[name] = flat.reshape(shape)
        return out

    def array_signature(self) -> list:
        """``[name, shape, dtype]`` of every ``state_dict`` entry (what a checkpoint's arrays
        must be, however the weights are stored)."""
        if self._signature is None:
            zeros = {n: np.zeros(shape, dt) for n, shape, dt in self.layout.entries()}
            self._signature = [[n, list(np.shape(v)), np.asarray(v).dtype.str]
                               for n, v in self.expand(zeros).items()]
        return self._signature

    # ---- views ------------------------------------------------------------------------
    def params(self, buffers) -> dict:
        """The weights in ``buffers``, ``{parameter name: numpy array}`` (slot axis first with
        per-slot weights)."""
        named = self.layout.to_named(buffers, prefix="params")
        store = self.store
        if store.separate:
            stored = {k[len("params."):]: v for k, v in named.items()}
        else:
            stored = named["params"] if store.groups is None else {g: named[f"params.{g}"] for g in store.layouts}
        if not self.per_slot:
            return {k: np.asarray(v) for k, v in store.unpack(stored).items()}
        per = [store.unpack(jax.tree_util.tree_map(lambda a: a[i], stored)) for i in range(self.n)]
        return {k: np.stack([np.asarray(p[k]) for p in per]) for k in per[0]}

    def predictor_state(self, buffers) -> dict:
        """What besides the weights a prediction is made from (``PREDICTING``, less
        ``NOT_PREDICTING``), by name."""
        out = {}
        for prefix in PREDICTING:
            for name, v in self.layout.to_named(buffers, prefix=prefix).items():
                if name not in NOT_PREDICTING:
                    out[name] = v
        return self.expand(out)

    def stats(self, buffers) -> dict:
        """The counters (summed over slots; ``step`` is the most any slot took with per-slot
        weights), the prequential loss per slot, and the rolling metrics per slot with the
        screen's and the rollback gate's counts where the learner has them; with a seasonal
        experts' mixture, ``seasons`` (N, C, 2): the season its seasonal expert uses and the
        other one found, per slot and channel (0: none yet)."""
        named = self.layout.to_named(buffers, prefix="stats.")
        counters = named["stats.counters"].reshape(-1, len(COUNTERS))
        out = {name: int(counters[:, i].sum()) for i, name in enumerate(COUNTERS) if name != "since_update"}
        if self.per_slot:
            out["step"] = int(counters[:, 0].max())
        n = np.maximum(named["stats.preq_n"], 1)
        out["prequential_loss"] = (named["stats.preq_sum"] / n).reshape(-1)
        roll = {k[len("stats.roll."):]: v for k, v in named.items() if k.startswith("stats.roll.")}
        roll = {k: v.reshape(-1) if k == "n" else v.reshape(-1, v.shape[-1]) for k, v in roll.items()}
        out["metrics"] = self.rolling.summary(roll)
        for key, name in (("screen", "outliers"), ("rollback", "rolled_back")):
            got = self.layout.to_named(buffers, prefix=f"{key}.count")
            if got:
                per = got[f"{key}.count"].reshape(-1)
                out[name] = int(per.sum())
                out["metrics"][name] = per.astype(np.int64)
        if self.combine is not None:
            out["seasons"] = self.combine.seasons_of(self._combine_state(buffers))
        return out

    def _combine_state(self, buffers) -> dict:
        """The experts' mixture's state tree (``L``, ``n``, ``aux`` by dtype) from ``buffers``."""
        named = self.layout.to_named(buffers, prefix="combine.")
        if self.per_slot:       # (slots, 1, ...): each slot's own one-slot state, stacked
            named = {k: v.reshape((-1,) + v.shape[2:]) for k, v in named.items()}
        aux = {k[len("combine.aux."):]: v for k, v in named.items() if k.startswith("combine.aux.")}
        return {"L": named["combine.L"], "n": named["combine.n"], "aux": aux}
