"""A recursive-least-squares readout: ``y = [h, x, 1] W``, solved exactly online.

Each step, with r the readout input (the model's output features h, optionally the encoded
input x, and a bias), forgetting factor lam (1: remember everything) and P the inverse of the
(forgetting-weighted, delta-regularised) covariance of r:

    k = P r / (lam + r' P r),   e = y - r' W,   W += k e',   P = (P - k r' P) / lam

P starts at I / delta. Every slot has its own W and P (each stream its own readout), also
when the model's weights are shared. A slot whose update is not finite keeps its old W, P.
(P - k r' P is kept symmetric bit for bit by its form; see ``update``.)

Several ``delta`` values: one readout per value, all updated every step, and each step's
prediction comes from the one with the lowest recent prequential error (an exponential
average of its squared prior errors over ``select_window`` steps). A strong ridge wins on short
or noisy streams, a weak one on long clean ones; the choice uses past errors only.

Learning the model under it (the hybrid): the loss of the readout's prediction, with W held
fixed, has gradient -W e with respect to h; that is what reaches the eligibility traces. With
several ``delta`` values the prediction is the best readout's, but W in that gradient is the most
regularised readout's: the weakly regularised W is large and swings while the readout is young,
and through the traces it threw the learned features into saturation (a GRU beside the default's
reservoir then added nothing on Mackey-Glass; through the ridge-0.1 W it beats a fixed GRU).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .symmetric import sym_matvec

__all__ = ["RLSReadout", "rls"]


class RLSReadout:
    def __init__(self, n_out: int | None = None, *, lam: float = 1.0, delta=1e-4,
                 use_input: bool = True, bias: bool = True, select_window: int = 100):
        if n_out is not None and (not isinstance(n_out, int) or n_out < 1):
            raise ValueError(f"rls: n_out must be a positive integer; got {n_out!r}")
        if not 0.0 < lam <= 1.0:
            raise ValueError(f"rls: lam (forgetting factor) must be in (0, 1]; got {lam}")
        deltas = tuple(float(d) for d in (delta if isinstance(delta, (tuple, list)) else (delta,)))
        if not deltas or not all(d > 0 for d in deltas):
            raise ValueError(f"rls: delta must be > 0 (P starts at I / delta); got {delta}")
        if not isinstance(select_window, int) or select_window < 1:
            raise ValueError(f"rls: select_window must be an integer >= 1; got {select_window!r}")
        self.n_out, self.lam, self.deltas = n_out, float(lam), deltas
        self.use_input, self.bias, self.select_window = bool(use_input), bool(bias), select_window

    def describe(self) -> dict:
        return {"kind": "rls", "n_out": self.n_out, "lam": self.lam, "delta": list(self.deltas),
                "use_input": self.use_input, "bias": self.bias, "select_window": self.select_window}

    def n_features(self, n_feat: int, n_in: int) -> int:
        return n_feat + (n_in if self.use_input else 0) + (1 if self.bias else 0)

    def init(self, n: int, n_feat: int, n_in: int, n_out: int, dtype) -> dict:
        m, k = self.n_features(n_feat, n_in), len(self.deltas)
        eye = jnp.eye(m, dtype=dtype)
        p0 = jnp.stack([eye / jnp.asarray(d, dtype) for d in self.deltas])
        return {"W": jnp.zeros((n, k, m, n_out), dtype), "P": jnp.broadcast_to(p0, (n, k, m, m)),
                "err": jnp.zeros((n, k), dtype)}

    def features(self, h, x):
        """(N, n_feat), (N, n_in) -> (N, m): the readout input r."""
        parts = [h.reshape(h.shape[0], -1)]
        if self.use_input:
            parts.append(x.reshape(x.shape[0], -1).astype(h.dtype))
        if self.bias:
            parts.append(jnp.ones((h.shape[0], 1), h.dtype))
        return jnp.concatenate(parts, axis=1)

    def _all(self, W, r):
        return jnp.einsum("nm,nkmo->nko", r.astype(W.dtype), W)

    def predict(self, state, r):
        """(N, n_out): the prediction of each slot's currently best readout (its gradient with
        respect to r: through the most regularised readout's W, see the module doc)."""
        ys = self._all(state["W"], r)
        if len(self.deltas) == 1:
            return ys[:, 0]
        best = jnp.argmin(jax.lax.stop_gradient(state["err"]), axis=1)
        chosen = jnp.take_along_axis(ys, best[:, None, None], axis=1)[:, 0]
        smooth = ys[:, self.deltas.index(max(self.deltas))]
        zero = smooth - jax.lax.stop_gradient(smooth)       # 0 in value, W_smooth in gradient
        return jax.lax.stop_gradient(chosen) + jnp.where(jnp.isfinite(smooth), zero, 0.0)

    def update(self, state, r, y, ok):
        """One RLS step of every readout per slot where ``ok`` (N,); returns (state, prior errors).

        P - P r r' P / (lam + r' P r) is written as an outer product of P r with itself, so it
        stays exactly symmetric; a refused update becomes the identity through its scale
        factors (no select over P): P is the big array, and each pass over it costs."""
        W, P = state["W"], state["P"]
        r = r.astype(W.dtype)
        e = y.reshape(y.shape[0], 1, -1).astype(W.dtype) - self._all(W, r)      # (N, k, o)
        Pr = sym_matvec(P, r[:, None, :])                                         # P symmetric
        den = self.lam + jnp.einsum("nj,nkj->nk", r, Pr)                          # (N, k)
        fine = ok[:, None] & jnp.isfinite(den) & (den > 0) & \
            jnp.isfinite(jnp.sum(Pr, axis=-1) + jnp.sum(e, axis=-1))
        inv = jnp.where(fine, 1.0 / jnp.where(fine, den, 1.0), 0.0)
        e = jnp.where(fine[..., None], e, 0.0)
        W2 = W + (Pr * inv[..., None])[..., :, None] * e[..., None, :]
        shrink = jnp.where(fine, 1.0 / self.lam, 1.0)[..., None, None]
        # (Pr_i Pr_j) inv: the (i, j) and (j, i) values one product rounded alike, so P stays
        # symmetric bit for bit (sym_matvec may sum it by rows or by columns)
        P2 = (P - Pr[..., :, None] * Pr[..., None, :] * inv[..., None, None]) * shrink
        a = 1.0 / self.select_window
        err2 = jnp.where(fine, (1 - a) * state["err"] + a * jnp.mean(e * e, axis=-1), state["err"])
        return {"W": W2, "P": P2, "err": err2}, e


def rls(n_out: int | None = None, *, lam: float = 1.0, delta=1e-4, use_input: bool = True,
        bias: bool = True, select_window: int = 100) -> RLSReadout:
    """A recursive-least-squares readout over the model's output features.

    The readout ``y = [h, x, 1] W`` is solved exactly online (each slot its own W and inverse
    covariance P), so a fixed model (``nn.Reservoir`` with ``frozen()``) learns in closed form,
    or a learning model gets its readout solved while the traces train the features under it.
    Several ``delta`` values: one readout each, and each step predicts with the one of lowest
    recent error.

    Parameters
    ----------
    n_out : int, optional
        The target's size; in forecast mode the forecast channels (default).
    lam : float, default 1.0
        Forgetting factor in (0, 1]; 1 remembers everything, 0.999 about the last 1000 steps.
    delta : float or sequence of float, default 1e-4
        The ridge: P starts at I / delta (larger: stronger regularisation); several to choose
        from.
    use_input : bool, default True
        Append the (transformed) input x to the features.
    bias : bool, default True
        Append a constant 1 to the features.
    select_window : int, default 100
        Steps (time constant) of the recent error by which one of several ``delta`` is chosen.

    Returns
    -------
    RLSReadout

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> learner = st.OnlineLearner(st.nn.Reservoir(1, 8), np.zeros(1, np.float32), mode="forecast",
    ...                            optimizer=st.frozen(), readout=st.rls(delta=[1e-4, 0.1]))
    >>> for t in range(50):
    ...     r = learner.step(np.array([np.sin(0.3 * t)], np.float32))
    >>> float(learner.stats()["metrics"]["mae"][0]) < 0.2
    True
    """
    return RLSReadout(n_out, lam=lam, delta=delta, use_input=use_input, bias=bias,
                      select_window=select_window)
