"""The arrays a ``weights`` message carries (``serve``'s: the learner's ``params`` and
``predictor_state``, slots first) and what the last publish held, kept as a digest per array
(crc32 of its bytes with its shape and dtype), not as the arrays: a bank of 16 default learners
publishes megabytes of arrays, which a copy kept for the next comparison would hold for good
(docs/devices.md); the digests and the message are made slot by slot (weights_frame.py). The
fixed weights (a reservoir's: in the buffers from the manifest's ``fixed_from`` on) never
change: an update, which carries only what changed, does not read them after the first."""
from __future__ import annotations

import zlib

import numpy as np

__all__ = ["WeightArrays", "digest"]


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
    None before any).

    >>> import tempfile
    >>> from streamtrace.export.write import export_learner     # (where streamtrace is installed)
    >>> from streamtrace_runner.runtime import Runner
    >>> from streamtrace_runner.bank import RunnerBank
    >>> from streamtrace_runner.weights_frame import digests
    >>> folder = tempfile.mkdtemp(); _ = export_learner(None, folder)
    >>> w = WeightArrays(RunnerBank(Runner(folder), 2))
    >>> d = digests(w.bank, w.chosen()); len(w.changed(d)) == len(d); w.remember(d); w.changed(d)
    True
    []
    >>> sorted(w.fixed)[:1], "params.fixed.W" in w.chosen(skip_fixed=True)
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

    def chosen(self, skip_fixed: bool = False) -> dict:
        """{message name: checkpoint name}; ``skip_fixed``: without the fixed weights."""
        return {n: k for n, k in self.names.items() if not (skip_fixed and n in self.fixed)}

    def changed(self, digests: dict) -> list:
        """The names of ``digests`` ({name: ``digest``}) that differ from the last publish (all
        of them before any)."""
        prev = self.published
        return [n for n, d in digests.items() if prev is None or prev.get(n) != d]

    def remember(self, digests: dict):
        """Arrays of ``digests`` were published: their digests replace the ones kept."""
        self.published = {**(self.published or {}), **digests}
