"""Signal transforms: what happens to a stream's numbers between the user and the model.

A transform is a small pure object (optax style) working on per-slot arrays (leading axis N):

    bind(channels) -> transform                     a copy fitted to what a forecast predicts: an
                                                     index into x's last axis (None: supervised
                                                     targets); the learner binds what it is given
    init(n, x_shape, y_shape) -> state
    encode(state, x) -> x'                          the model's input
    target(state, x, y) -> y'                       the model-space target of a prediction made
                                                     from input x (user units, as x arrived)
    decode(state, x, y') -> y                       a model-space prediction back to user units
    observe(state, x, y, ok) -> state               learn the statistics from a new sample
    ready(state) -> (N,) bool                       whether a slot's transform is settled
                                                     (the learner learns only from settled slots)
    widen(n_in, n_out) -> int                       the model's input size (feedback adds inputs)

``chain(a, b)`` runs a then b: b sees a's encoding of x, and decodes before a does. Order the
normaliser first so the residual is taken in normalised units.
"""
from __future__ import annotations

import copy

__all__ = ["Transform", "chain", "Identity"]


class Transform:
    name = "transform"
    channels = None

    def bind(self, channels) -> "Transform":
        out = copy.copy(self)
        out.channels = channels
        return out

    def init(self, n, x_shape, y_shape):
        return {}

    def encode(self, state, x):
        return x

    def target(self, state, x, y):
        return y

    def decode(self, state, x, y):
        return y

    def observe(self, state, x, y, ok):
        return state

    def ready(self, state):
        return True

    def widen(self, n_in: int, n_out: int | None) -> int:
        """The model's input size for 1-D inputs of ``n_in`` values (targets: ``n_out``)."""
        return n_in

    def describe(self) -> dict:
        """Settings recorded in checkpoints (plain numbers and strings)."""
        return {"kind": self.name}


class Identity(Transform):
    name = "identity"


class _Chain(Transform):
    name = "chain"

    def __init__(self, parts):
        self.parts = tuple(parts)
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"chain: each transform at most once; got {names}")

    def bind(self, channels):
        return _Chain(p.bind(channels) for p in self.parts)

    def init(self, n, x_shape, y_shape):
        return {p.name: p.init(n, x_shape, y_shape) for p in self.parts}

    def _inputs(self, state, x):
        xs = [x]
        for p in self.parts:
            xs.append(p.encode(state[p.name], xs[-1]))
        return xs

    def encode(self, state, x):
        return self._inputs(state, x)[-1]

    def target(self, state, x, y):
        for p, xi in zip(self.parts, self._inputs(state, x)):
            y = p.target(state[p.name], xi, y)
        return y

    def decode(self, state, x, y):
        xs = self._inputs(state, x)
        for p, xi in reversed(list(zip(self.parts, xs))):
            y = p.decode(state[p.name], xi, y)
        return y

    def observe(self, state, x, y, ok):
        # each part learns from the signal as it sees it (statistics before this sample's update)
        new, xi = {}, x
        for p in self.parts:
            new[p.name] = p.observe(state[p.name], xi, y, ok)
            y = None if y is None else p.target(state[p.name], xi, y)
            xi = p.encode(state[p.name], xi)
        return new

    def ready(self, state):
        out = True
        for p in self.parts:
            out = out & p.ready(state[p.name])
        return out

    def widen(self, n_in, n_out):
        for p in self.parts:
            n_in = p.widen(n_in, n_out)
        return n_in

    def describe(self):
        return {"kind": "chain", "parts": [p.describe() for p in self.parts]}


def chain(*parts: Transform) -> Transform:
    """Compose signal transforms, applied left to right on the way in.

    Each transform maps the user's signal towards the model (inputs and targets) and the
    model's prediction back to the user's units, in reverse order. Put ``screen()`` first (it
    screens the stream's own numbers) and ``feedback()`` last.

    Parameters
    ----------
    *parts : Transform
        ``screen()``, ``normalise()``, ``residual()``, ``feedback()``, in order.

    Returns
    -------
    Transform
        The composition (a single part is returned as it is).

    Examples
    --------
    >>> import streamtrace as st
    >>> t = st.chain(st.normalise(warmup=10), st.residual())
    >>> [part["kind"] for part in t.describe()["parts"]]
    ['normalise', 'residual']
    """
    for p in parts:
        if not isinstance(p, Transform):
            raise TypeError(f"chain takes transforms; got {type(p).__name__}")
    return parts[0] if len(parts) == 1 else _Chain(parts)
