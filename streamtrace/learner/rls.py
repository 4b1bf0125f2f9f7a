"""A recursive-least-squares readout: ``y = [h, x, 1] W``, solved exactly online.

Each step, with r the readout input (the model's output features h, optionally the encoded
input x, and a bias), forgetting factor lam (1: remember everything) and P the inverse of the
(forgetting-weighted, delta-regularised) covariance of r:

    k = P r / (lam + r' P r),   e = y - r' W,   W += k e',   P = (P - k r' P) / lam

P starts at I / delta. Every slot has its own W and P (each stream its own readout), also
when the model's weights are shared. A slot whose update is not finite keeps its old W, P.

Learning the model under it (the hybrid): the loss of the readout's prediction, with W held
fixed, has gradient -W e with respect to h; that is what reaches the eligibility traces.
"""
from __future__ import annotations

import jax.numpy as jnp

__all__ = ["RLSReadout", "rls"]


class RLSReadout:
    def __init__(self, n_out: int | None = None, *, lam: float = 1.0, delta: float = 1e-4,
                 use_input: bool = True, bias: bool = True):
        if n_out is not None and (not isinstance(n_out, int) or n_out < 1):
            raise ValueError(f"rls: n_out must be a positive integer; got {n_out!r}")
        if not 0.0 < lam <= 1.0:
            raise ValueError(f"rls: lam (forgetting factor) must be in (0, 1]; got {lam}")
        if not delta > 0:
            raise ValueError(f"rls: delta must be > 0 (P starts at I / delta); got {delta}")
        self.n_out, self.lam, self.delta = n_out, float(lam), float(delta)
        self.use_input, self.bias = bool(use_input), bool(bias)

    def describe(self) -> dict:
        return {"kind": "rls", "n_out": self.n_out, "lam": self.lam, "delta": self.delta,
                "use_input": self.use_input, "bias": self.bias}

    def n_features(self, n_feat: int, n_in: int) -> int:
        return n_feat + (n_in if self.use_input else 0) + (1 if self.bias else 0)

    def init(self, n: int, n_feat: int, n_in: int, n_out: int, dtype) -> dict:
        m = self.n_features(n_feat, n_in)
        p0 = jnp.eye(m, dtype=dtype) / jnp.asarray(self.delta, dtype)
        return {"W": jnp.zeros((n, m, n_out), dtype), "P": jnp.broadcast_to(p0, (n, m, m))}

    def features(self, h, x):
        """(N, n_feat), (N, n_in) -> (N, m): the readout input r."""
        parts = [h.reshape(h.shape[0], -1)]
        if self.use_input:
            parts.append(x.reshape(x.shape[0], -1).astype(h.dtype))
        if self.bias:
            parts.append(jnp.ones((h.shape[0], 1), h.dtype))
        return jnp.concatenate(parts, axis=1)

    def predict(self, state, r):
        return jnp.einsum("nm,nmo->no", r, state["W"])

    def update(self, state, r, y, ok):
        """One RLS step per slot where ``ok`` (N,); returns (state, prior error e)."""
        W, P = state["W"], state["P"]
        e = y.reshape(y.shape[0], -1).astype(W.dtype) - self.predict(state, r)
        Pr = jnp.einsum("nij,nj->ni", P, r)
        k = Pr / (self.lam + jnp.sum(r * Pr, axis=1, keepdims=True))
        W2 = W + k[:, :, None] * e[:, None, :]
        P2 = (P - k[:, :, None] * Pr[:, None, :]) / self.lam
        P2 = 0.5 * (P2 + jnp.swapaxes(P2, 1, 2))   # rounding makes P drift from symmetric
        fine = ok & jnp.isfinite(jnp.sum(W2, axis=(1, 2)) + jnp.sum(P2, axis=(1, 2)))
        keep = lambda new, old: jnp.where(fine[:, None, None], new, old)
        return {"W": keep(W2, W), "P": keep(P2, P)}, e


def rls(n_out: int | None = None, *, lam: float = 1.0, delta: float = 1e-4, use_input: bool = True,
        bias: bool = True) -> RLSReadout:
    """An RLS readout over the model's output features (see ``RLSReadout``); ``n_out`` defaults
    to the forecast channels in forecast mode."""
    return RLSReadout(n_out, lam=lam, delta=delta, use_input=use_input, bias=bias)


