"""Learning-signal hooks: change dL/dh (or the traces it meets) before the contraction.

A hook is a small object with optional methods, all pure. ``bind(algo)`` returns a copy
fitted to one algorithm (shapes, trace names), so one hook object may serve many algorithms.

* ``init(algo) -> dict``: extra named state carried with the traces (e.g. filtered traces);
* ``forward(traces) -> traces``: runs after the trace update in the forward pass;
* ``contraction_traces(traces) -> traces``: which traces the learning signal meets;
* ``transform(g, ctx) -> g``: replaces the learning signal, per hidden group (..., O, S).

Hooks compose with ``SignalChain`` (a list given to an algorithm is chained in order); not to be
confused with ``streamtrace.chain``, which composes input transforms.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = ["LearningSignal", "SignalChain", "Chain", "RandomFeedback", "KappaFilter", "SignalContext", "as_signal"]


@dataclass(frozen=True)
class SignalContext:
    graph: Any
    output: Any          # the step's output
    output_cotangent: Any  # dL/d output
    new_hidden: dict


class LearningSignal:
    def bind(self, algo) -> "LearningSignal":
        """A copy of this hook fitted to ``algo`` (graph shapes and trace names known)."""
        return self

    def init(self, algo) -> dict:
        return {}

    def forward(self, traces: dict) -> dict:
        return traces

    def contraction_traces(self, traces: dict) -> dict:
        return traces

    def transform(self, g: list, ctx: SignalContext) -> list:
        return g


class SignalChain(LearningSignal):
    """Learning-signal hooks applied in order."""

    def __init__(self, *hooks: LearningSignal):
        self.hooks = hooks

    def bind(self, algo):
        return SignalChain(*(h.bind(algo) for h in self.hooks))

    def init(self, algo):
        out = {}
        for h in self.hooks:
            out.update(h.init(algo))
        return out

    def forward(self, traces):
        for h in self.hooks:
            traces = h.forward(traces)
        return traces

    def contraction_traces(self, traces):
        for h in self.hooks:
            traces = h.contraction_traces(traces)
        return traces

    def transform(self, g, ctx):
        for h in self.hooks:
            g = h.transform(g, ctx)
        return g


Chain = SignalChain     # the old name, kept for existing imports


def as_signal(signal) -> LearningSignal:
    if signal is None:
        return LearningSignal()
    if isinstance(signal, (list, tuple)):
        return SignalChain(*signal)
    if not isinstance(signal, LearningSignal):
        raise TypeError(f"signal must be a LearningSignal or a list of them; got {type(signal).__name__}")
    return signal


class RandomFeedback(LearningSignal):
    """Fixed random feedback (random e-prop / feedback alignment): the learning signal of
    group g is ``dL/dout @ B_g`` with a fixed random ``B_g`` of shape (S, out, O) instead of
    the transpose of the readout path. The output must be one array (..., out)."""

    def __init__(self, seed: int = 0, scale: float | None = None, B=None):
        self.seed, self.scale, self.B = seed, scale, B

    def bind(self, algo):
        graph = algo.graph
        out = graph.out_struct
        if not hasattr(out, "shape") or len(out.shape) == 0:
            raise TypeError("RandomFeedback needs the model output to be one array of shape (..., out)")
        n_out = out.shape[-1]
        rng = np.random.default_rng(self.seed)
        scale = self.scale if self.scale is not None else 1.0 / np.sqrt(n_out)
        return RandomFeedback(self.seed, self.scale,
                              [rng.normal(0.0, scale, (g.size, n_out, g.shape[-1])) for g in graph.groups])

    def transform(self, g, ctx):
        ct = ctx.output_cotangent
        return [jnp.einsum("...k,sko->...os", ct, jnp.asarray(B, ct.dtype)) for B in self.B]


class KappaFilter(LearningSignal):
    """e-prop's kappa filter: the learning signal meets the low-pass filtered eligibility
    trace ``e_bar = kappa * e_bar + e`` (the causal form of filtering the learning signal with
    the readout's leak kappa; over a sequence the two give the same sum). For ES-D-RTRL each
    factor is filtered, which approximates the filtered product."""

    def __init__(self, kappa: float, names: tuple = ()):
        if not 0.0 <= kappa < 1.0:
            raise ValueError(f"kappa must be in [0, 1); got {kappa}")
        self.kappa, self.names = kappa, tuple(names)

    def bind(self, algo):
        return KappaFilter(self.kappa, tuple(algo.base_traces()))

    def init(self, algo):
        base = algo.base_traces()
        return {f"kappa.{n}": jnp.zeros_like(base[n]) for n in self.names}

    def forward(self, traces):
        out = dict(traces)
        for n in self.names:
            out[f"kappa.{n}"] = self.kappa * traces[f"kappa.{n}"] + traces[n]
        return out

    def contraction_traces(self, traces):
        out = dict(traces)
        for n in self.names:
            out[n] = traces[f"kappa.{n}"]
        return out
