"""A learner's checkpoints: what one must match, writing one and continuing from one.

``Saving`` is mixed into ``OnlineLearner``; it uses the learner's settings signature, its
packed ``layout``, its named view of the state (``names``) and ``state_dict`` /
``load_state_dict``; a checkpoint of another experts' mixture is fitted by
``mixture_upgrade``.
"""
from __future__ import annotations

import warnings

from .checkpoint import read_checkpoint, write_checkpoint
from .mixture_upgrade import fit_checkpoint

__all__ = ["Saving"]


class Saving:
    """Checkpoints of a learner's whole state (a mixin of ``OnlineLearner``)."""
    def signature(self) -> dict:
        """What a checkpoint must match: the settings, the packed layout ("state"), and the
        saved arrays themselves ("state_dict": name, shape, dtype of every ``state_dict()``
        entry). The arrays do not depend on how the state is stored (one packed weight block
        or an array per weight), so a checkpoint is checked by them when both sides have them."""
        return {**self._signature_extra, "state": self.layout.signature(),
                "state_dict": self.names.array_signature()}

    def save(self, path, extra: dict | None = None):
        """Write the whole learner state to a checkpoint file, atomically.

        Weights, optimizer state, traces, hidden states and counters, written to a temporary
        file, synced and renamed over ``path``: a crash leaves the old file or the new one.

        Parameters
        ----------
        path : str or os.PathLike
            The checkpoint file.
        extra : dict, optional
            JSON-able values stored in the header (``restore`` returns them).

        Examples
        --------
        >>> import numpy as np, pathlib, tempfile, streamtrace as st
        >>> L = st.OnlineLearner(st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1), np.zeros(1, np.float32))
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = L.save(folder / "day1.ckpt", extra={"note": "day 1"})
        >>> [p.name for p in folder.iterdir()]
        ['day1.ckpt']
        """
        return write_checkpoint(path, self.state_dict(), self.signature(), extra)

    def restore(self, path) -> dict:
        """Load a checkpoint written by ``save``: the learner continues exactly from it.

        Refuses (``CheckpointError``) a file of another model or settings, or a corrupted one.
        A file whose experts' mixture (``combine``) is of another kind, as an older release's
        default, resumes everything else; the mixture starts afresh, with a ``UserWarning``
        (also in ``header["warnings"]``).

        Parameters
        ----------
        path : str or os.PathLike
            A file written by ``save`` of a learner built the same way.

        Returns
        -------
        dict
            The checkpoint's header; ``header["extra"]`` holds what ``save`` was given.

        Examples
        --------
        >>> import numpy as np, streamtrace as st
        >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
        >>> L = st.OnlineLearner(model, np.zeros(1, np.float32))
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "learner.ckpt"
        >>> _ = L.save(path, extra={"note": "day 1"})
        >>> _ = L.step(np.ones(1, np.float32), np.ones(1, np.float32))
        >>> header = L.restore(path)
        >>> L.stats()["step"], header["extra"]
        (0, {'note': 'day 1'})
        """
        arrays, header = read_checkpoint(path)
        named = fit_checkpoint(path, self.signature(), header, arrays, self.state_dict)
        self.load_state_dict(named)
        for line in header.get("warnings", []):       # another mixture; other optimizer settings
            warnings.warn(line, UserWarning, stacklevel=2)
        return header
