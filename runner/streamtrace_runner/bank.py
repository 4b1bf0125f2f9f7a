"""A model per stream: ``n`` states of one exported one-slot learner, each stepped alone by the
same program (as ``serve``'s slot bank), read and written as the bank's checkpoints: every
array with the ``n`` slots first, the one-slot signature grown to ``n`` slots, so a checkpoint
crosses between ``serve`` and the runner both ways."""
from __future__ import annotations

import numpy as np

from .heap import trim

__all__ = ["RunnerBank", "grown_signature"]


def grown_signature(sig: dict, n: int) -> dict:
    """A one-slot learner's checkpoint signature ``sig`` for a bank of ``n`` slots (every state
    array with the n slots first): what ``serve``'s slot bank and this one write.

    >>> grown_signature({"slots": 1, "state": [["w", [1, 3], "<f8"]], "state_dict": []}, 4)["state"]
    [['w', [4, 3], '<f8']]
    """
    grow = lambda entries: [[name, [n] + list(shape[1:]), dt] for name, shape, dt in entries]
    return {**sig, "slots": n, "state": grow(sig["state"]), "state_dict": grow(sig["state_dict"])}


class RunnerBank:
    """``n`` per-stream states of ``runner`` (a ``runtime.Runner`` of a one-slot export).

    >>> import tempfile
    >>> from streamtrace.export.write import export_learner     # (where streamtrace is installed)
    >>> from streamtrace_runner.runtime import Runner
    >>> folder = tempfile.mkdtemp(); _ = export_learner(None, folder)
    >>> bank = RunnerBank(Runner(folder), 4)
    >>> prediction, loss, applied = bank.step(2, np.array([0.5]), None, True)
    >>> bank.state_dict()["stats.counters"].shape[0], bank.signature()["slots"]
    (4, 4)
    """

    def __init__(self, runner, n: int):
        if runner.manifest["slots"] != 1:
            raise ValueError(f"a bank steps a one-slot export; this one has {runner.manifest['slots']} slots "
                             "(export with --slots 1)")
        self.runner, self.n = runner, n
        # a slot no stream has stepped holds None, the initial state given when first stepped:
        # the first, the runner's own loaded state (a lone stream's runner holds one state, not
        # two); later ones, one copy read from the folder again and shared (the programs never
        # write their inputs)
        self.slots = [None] * n
        self._loaded = runner.buffers         # the initial state the runner loaded, not yet handed out
        self._initial = None

    def _fresh(self) -> list:
        if self._initial is None:
            self._initial = self.runner.initial_buffers()
        return self._initial

    def _state(self, slot: int) -> list:
        """The slot's buffers, the initial state for a fresh slot."""
        if self.slots[slot] is None:
            if self._loaded is not None:
                self.slots[slot], self._loaded = self._loaded, None
            else:
                self.slots[slot] = self._fresh()
        return self.slots[slot]

    def step(self, slot: int, x, y, learn: bool):
        """One step of ``slot``: (prediction, loss, applied) of its one slot; its events
        (outlier, rolled_back) in ``runner.events``."""
        r = self.runner
        r.buffers = self._state(slot)
        out = r.step(np.asarray(x)[None], None if y is None else np.asarray(y)[None], learn=bool(learn))
        self.slots[slot] = r.buffers
        return out

    def predict(self, slot: int, x, y, learn: bool):
        """``step``'s (prediction, loss, applied (False)) without the step: the export's
        prediction twin on the slot's state, which stays as it is."""
        r = self.runner
        r.buffers = self._state(slot)
        return r.predict(np.asarray(x)[None], None if y is None else np.asarray(y)[None], learn=bool(learn))

    def label(self, slot: int, y, age: int) -> tuple:
        """The label ``y`` of the slot's step ``age`` steps back (the export's label program):
        (status, loss, applied); status 0 applied, else the state unchanged (labels.CODES)."""
        r = self.runner
        r.buffers = self._state(slot)
        got = r.label(y, age, 0)
        self.slots[slot] = r.buffers
        return got

    def reset(self, slot: int):
        """The slot's state back to the export's initial one (made when next stepped)."""
        self.slots[slot] = None

    def slot_state(self, slot: int, names=None) -> dict:
        """{checkpoint name: array} of one slot (a leading axis of 1); ``names``: only those."""
        state = self.slots[slot]
        if state is None:            # read, not kept: a fresh slot stays free of memory
            state = self._loaded if self._loaded is not None else self._fresh()
        # only the buffers holding ``names`` come to the host (a weights message of the default
        # learner needs none of the readout's P, 0.76 MB a slot)
        m = self.runner.map
        return m.named(self.runner.host(state, m.buffers_of(names)), names)

    def state_dict(self, names=None) -> dict:
        """{checkpoint name: array} with the n slots first; ``names``: only those. Filled slot
        by slot (one slot's host copy at a time, no per-slot list concatenated)."""
        out = {}
        for s in range(self.n):
            for k, v in self.slot_state(s, names).items():
                if k not in out:
                    out[k] = np.empty((self.n, *np.shape(v)[1:]), np.asarray(v).dtype)
                out[k][s:s + 1] = v
        return out

    def load_state_dict(self, named: dict):
        """Every slot's state from arrays with the n slots first; refused (ValueError, nothing
        changes) if one has another slot count."""
        for name, v in named.items():
            if np.ndim(v) < 1 or np.shape(v)[0] != self.n:
                raise ValueError(f"state '{name}' has shape {np.shape(v)}, expected {self.n} slots first")
        self.slots = [self.runner.device_buffers({k: np.asarray(v)[s:s + 1] for k, v in named.items()})
                      for s in range(self.n)]
        trim()

    def signature(self) -> dict:
        """The one-slot signature with n slots first (what ``serve``'s bank writes)."""
        return grown_signature(self.runner.manifest["signature"], self.n)
