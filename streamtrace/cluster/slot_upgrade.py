"""Resuming a partition checkpoint whose experts' mixture is of another kind.

A worker's partition checkpoint (``Stepper.snapshot``) holds each stream's slot state as
arrays ``s{i}.{j}``: stream i, leaf j of the slot's state, whose paths the signature lists
(``slot_state``). A release that changes the experts' mixture (``combine``: an expert added,
season detection on by default) changes the mixture's leaves and so shifts the numbering of
every leaf after them. Refusing such a checkpoint would throw away each stream's model,
traces, readout and normaliser, and replay the whole log; instead ``fit_partition`` maps
every other leaf by its path and gives the mixture a fresh slot's state, with a warning, as
``serve`` does for its own checkpoints. Any other difference is still refused.
"""
from __future__ import annotations

import logging

from ..learner.checkpoint import CheckpointError, check_signature, signature_without

__all__ = ["fit_partition", "is_mixture_leaf"]

_MIXTURE = "combine"
log = logging.getLogger("streamtrace.cluster")


def is_mixture_leaf(path: str) -> bool:
    """Whether a ``slot_state`` path (``jax.tree_util.keystr``) is the mixture's.

    >>> is_mixture_leaf("['combine']['aux']['float']"), is_mixture_leaf("['hidden']['h']")
    (True, False)
    """
    return path.startswith(f"['{_MIXTURE}']")


def _is_mixture(key: str) -> bool:          # a signature's section, or a slot_state path
    return key == _MIXTURE or is_mixture_leaf(key)


def fit_partition(label: str, want: dict, header: dict, arrays: dict, fresh: dict) -> dict:
    """The arrays of a partition checkpoint (``arrays``, its ``header``) for a worker whose
    signature is ``want``, numbered as that worker's slot state.

    A checkpoint that fits is returned as it is. One that differs only in its mixture gets
    every other leaf by its path, each mixture leaf from ``fresh``, and a line in
    ``header["warnings"]`` (also logged); any other difference raises ``CheckpointError`` naming it.

    Parameters
    ----------
    label : str
        The checkpoint's name, for messages.
    want : dict
        The worker's signature (``Stepper.signature``: with ``slot_state``).
    header, arrays : dict
        What ``loads_checkpoint`` returned for it (``header["extra"]["streams"]``: its streams).
    fresh : dict
        ``{leaf index in want's slot_state: array}`` of a fresh slot, for each mixture leaf.

    Examples
    --------
    >>> import numpy as np
    >>> old = {"combine": {"period": 0}, "slot_state": [["['combine']['L']", [1, 4], "<f8"],
    ...                                                 ["['hidden']['h']", [1, 2], "<f8"]]}
    >>> new = {"combine": {"period": 12}, "slot_state": [["['combine']['L']", [1, 5], "<f8"],
    ...                                                  ["['combine']['n']", [1], "<i4"],
    ...                                                  ["['hidden']['h']", [1, 2], "<f8"]]}
    >>> header = {"signature": old, "extra": {"streams": [["a", 3]]}}
    >>> arrays = {"s0.0": np.zeros((1, 4)), "s0.1": np.ones((1, 2))}
    >>> got = fit_partition("p0", new, header, arrays, {0: np.zeros((1, 5)), 1: np.zeros(1, np.int32)})
    >>> sorted(got), got["s0.2"].tolist(), len(header["warnings"])
    (['s0.0', 's0.1', 's0.2'], [[1.0, 1.0]], 1)
    """
    got = header.get("signature", {})
    try:
        check_signature(label, want, header)
        return arrays
    except CheckpointError as whole:
        try:
            check_signature(label, signature_without(want, _is_mixture), {**header, "signature": signature_without(got, _is_mixture)})
        except CheckpointError:
            raise whole from None
    where = {entry[0]: j for j, entry in enumerate(got.get("slot_state", []))}
    out = {}
    for i in range(len(header.get("extra", {}).get("streams", []))):
        for j, entry in enumerate(want["slot_state"]):
            out[f"s{i}.{j}"] = fresh[j] if is_mixture_leaf(entry[0]) else arrays[f"s{i}.{where[entry[0]]}"]
    line = (f"{label}: the experts' mixture in this checkpoint is of another kind (settings or layout); "
            f"resumed everything else, the mixture starts afresh")
    log.warning(line)
    header.setdefault("warnings", []).append(line)
    return out
