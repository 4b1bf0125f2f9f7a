"""Resuming a checkpoint whose experts' mixture is of another kind.

The experts' mixture (``combine``) keeps a few hundred steps' worth of state: each expert's
recent losses, the period detector's ring, the linear expert's statistics. A checkpoint written
by a learner whose mixture differs in its settings or layout (a release that added an expert,
or turned season detection on by default) would otherwise be refused whole, and with it the
model's weights, traces, readout and normaliser, which took the stream's whole history to
learn. ``fit_checkpoint`` loads such a checkpoint with everything but the mixture, whose state
starts afresh, and says so in a warning; any other difference is still refused.
"""
from __future__ import annotations

from ..checkpoints import CheckpointError, check_signature, signature_diff, signature_without

__all__ = ["fit_checkpoint"]

_MIXTURE = "combine"


def _is_mixture(name: str) -> bool:
    return name == _MIXTURE or name.startswith(_MIXTURE + ".")


def fit_checkpoint(path, want: dict, header: dict, arrays: dict, fresh) -> dict:
    """The arrays to load from a checkpoint (``arrays``, its ``header``) into a learner of
    signature ``want`` whose current state ``fresh()`` gives (its ``state_dict``).

    A checkpoint that fits is returned as it is. One that differs only in its experts' mixture
    gets the mixture's arrays from ``fresh()`` and a line in ``header["warnings"]``; any other
    difference raises ``CheckpointError`` naming it, as ``check_signature`` does.

    Parameters
    ----------
    path : str or Path
        The checkpoint's name, for messages.
    want : dict
        The learner's ``signature()``.
    header, arrays : dict
        What ``read_checkpoint`` returned for it.
    fresh : callable
        Returns the learner's ``state_dict()`` to take the mixture's state from (called only
        for a checkpoint of another mixture).

    Examples
    --------
    >>> import numpy as np, pathlib, tempfile, streamtrace as st
    >>> from streamtrace.checkpoints import read_checkpoint
    >>> def learner(combine):
    ...     return st.OnlineLearner(st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1), np.zeros(1, np.float32),
    ...                             mode="forecast", combine=combine)
    >>> old = learner(st.experts())
    >>> for t in range(20):
    ...     _ = old.step(np.array([np.sin(0.3 * t)], np.float32))
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "old.ckpt"
    >>> _ = old.save(path)
    >>> new = learner(st.experts(period=12))                  # another kind of mixture
    >>> arrays, header = read_checkpoint(path)
    >>> named = fit_checkpoint(path, new.signature(), header, arrays, new.state_dict)
    >>> new.load_state_dict(named)
    >>> bool(np.array_equal(new.params["out.W"], old.params["out.W"])), len(header["warnings"])
    (True, 1)
    """
    try:
        check_signature(path, want, header, arrays)
        return arrays
    except CheckpointError as whole:
        got = header.get("signature", {})
        if not any(_is_mixture(k) for k in set(got) | set(want)):
            raise
        kept = {n: a for n, a in arrays.items() if not _is_mixture(n)}
        try:
            check_signature(path, signature_without(want, _is_mixture), {**header, "signature": signature_without(got, _is_mixture)}, kept)
        except CheckpointError:
            raise whole from None
    named = {**{n: a for n, a in fresh().items() if _is_mixture(n)}, **kept}
    mixture = lambda sig: {k: v for k, v in sig.items() if _is_mixture(k)}        # noqa: E731
    what = "; ".join(signature_diff(mixture(want), mixture(got))) or "its state's layout"
    header.setdefault("warnings", []).append(
        f"{path}: the experts' mixture in this checkpoint is of another kind ({what}); "
        f"resumed everything else, the mixture starts afresh")
    return named
