"""The arrays a ``weights`` message carries (``serve``'s: the learner's ``params`` and
``predictor_state``, the rows of the slots serving a stream first) and what the last publish held, kept as a digest per array
(crc32 of its bytes with its shape and dtype), not as the arrays: a bank of 16 default learners
publishes megabytes of arrays, which a copy kept for the next comparison would hold for good
(docs/devices.md); the digests and the message are made slot by slot (weights_frame.py). The
fixed weights (a reservoir's: in the buffers from the manifest's ``fixed_from`` on) never
change: an update, which carries only what changed, does not read them after the first."""
from __future__ import annotations

import zlib

import numpy as np

__all__ = ["WeightArrays", "digest", "served"]


def served(slot_of: dict) -> tuple[list, dict]:
    """The slots a weights message carries and each stream's row among them.

    A message holds the rows of the slots that serve a stream, in slot order (a bank's free
    slots are not sent: 16 slots of the default learner would be 5 MB of reservoir weights for
    one stream). ``slot_of``: {stream: its slot}. Returns (slots, {stream: row}).

    >>> served({"b": 7, "a": 2})
    ([2, 7], {'b': 1, 'a': 0})
    """
    slots = sorted(set(slot_of.values()))
    row = {s: i for i, s in enumerate(slots)}
    return slots, {name: row[s] for name, s in slot_of.items()}


def digest(a) -> tuple:
    """(shape, dtype, crc32 of the bytes) of an array.

    >>> digest(np.zeros(3)) == digest(np.zeros(3)), digest(np.zeros(3)) == digest(np.ones(3))
    (True, False)
    """
    a = np.ascontiguousarray(a)
    return a.shape, a.dtype.str, zlib.crc32(a.reshape(-1).view(np.uint8))


class WeightArrays:
    """The weights of a ``bank.RunnerBank`` under their message names ("params.<name>",
    "state.<name>" -> checkpoint name), and the digests of the last publish (``published``:
    None before any) with the slots it held (``slots``).

    >>> import tempfile
    >>> from streamtrace.export.write import export_learner     # (where streamtrace is installed)
    >>> from streamtrace_runner.runtime import Runner
    >>> from streamtrace_runner.bank import RunnerBank
    >>> from streamtrace_runner.weights_frame import digests
    >>> folder = tempfile.mkdtemp(); _ = export_learner(None, folder)
    >>> w = WeightArrays(RunnerBank(Runner(folder), 2))
    >>> d = digests(w.bank, w.chosen(), [0]); len(w.changed(d, [0])) == len(d); w.remember(d, [0])
    True
    >>> w.changed(d, [0]), len(w.changed(d, [1])) == len(d)    # other slots: every array
    ([], True)
    >>> sorted(w.fixed)[:1], "params.fixed.W" in w.chosen([0], skip_fixed=True)
    (['params.fixed.W'], False)
    """

    def __init__(self, bank):
        m = bank.runner.manifest
        where = m.get("weights", {"params": {}, "state": {}})
        self.bank = bank
        self.names = {**{f"params.{n}": k for n, k in where["params"].items()},
                      **{f"state.{n}": k for n, k in where["state"].items()}}
        fixed_from, smap = m.get("fixed_from", len(m["buffers"])), bank.runner.map
        self.fixed = {n for n, k in self.names.items() if smap.buffer_of(k) >= fixed_from}
        self.published: dict | None = None
        self.slots: list | None = None

    def _held_for(self, slots) -> dict | None:
        """The digests of the last publish if it held these ``slots``' rows, else None."""
        return self.published if list(slots) == self.slots else None

    def chosen(self, slots=None, skip_fixed: bool = False) -> dict:
        """{message name: checkpoint name}; ``skip_fixed``: without the fixed weights, where the
        last publish held them for the same ``slots``."""
        skip = skip_fixed and self._held_for(slots) is not None
        return {n: k for n, k in self.names.items() if not (skip and n in self.fixed)}

    def changed(self, digests: dict, slots) -> list:
        """The names of ``digests`` ({name: ``digest``} of the rows of ``slots``) that differ
        from the last publish (all of them before any, or where it held other slots)."""
        prev = self._held_for(slots)
        return [n for n, d in digests.items() if prev is None or prev.get(n) != d]

    def remember(self, digests: dict, slots):
        """Arrays of ``digests`` were published for ``slots``: their digests replace the ones kept
        (all of them, where the slots changed)."""
        self.published = {**(self._held_for(slots) or {}), **digests}
        self.slots = list(slots)
