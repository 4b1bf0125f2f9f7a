"""A fast linear expert: recursive least squares with forgetting on the last changes and the seasonal lags.

Per slot and channel, with d_t = y_t - y_{t-1}, s the changes' running root mean square (a scale
that a trend does not inflate) and p1, p2 the seasons found so far (learner/period.py; 0: none, a
regressor whose lag is 0 or beyond the ring is 0):

    z_t = c( [ d_{t-1} / s,  d_{t-2} / s,  d_{t-p1} / s,  d_{t-p1-1} / s,  d_{t-p1-2} / s,
               d_{t-p2} / s,  d_{t-2 p1} / s ] )
    prediction   y_{t-1} + s * w^T z_t

where c clips each scaled change to [-2.5, 2.5] (``CLIP``): a level shift is one change of many
s, which the seasonal lags would otherwise forecast again a season later (and two seasons
later), as if the jump were part of the season; clipped, it counts as at most a large change.
On a held-out monthly series whose level jumps by 8 (``bench/short_seasons.py --held-out``,
level-shift) the default went from 1.123x to 1.043x the best peer; clipping at 2 cost the
airline series 1.057x, at 3 the shift stayed 1.052x.

so w = 0 is persistence, w = e_3 is the seasonal naive forecast with drift (y_{t-1} + y_{t-p}
- y_{t-p-1}, SARIMA(0,1,0)(0,1,0)_p); the lags one and two steps after a season pair with the
last two changes as a seasonal ARIMA's autoregression on the twice-differenced series does, and
the change two seasons back lets it average the seasons. Changes only, no level and no
intercept: a trend's drift is already in the seasonal lag's change, and on series of 100-300
points a level and an intercept, two more weights to learn from a few dozen targets, made its
forecasts worse on trending seasons (monthly with a trend 1.044x -> 1.057x the best peer,
airline 1.027x -> 1.065x; docs/quality.md). When y_t arrives (from the third target on), w and
the inverse covariance P learn the scaled change d_t / s by RLS with forgetting lam:

    k = P z / (lam + z^T P z),   w <- w + k (d_t / s - w^T z),   P <- (P - k z^T P) / lam

starting from w = 0, P = I / delta (and afresh, ``restart``, when a detected season first
appears); then s^2 <- s^2 + a (d_t^2 - s^2), a = max(1/k, 1/window) after k changes. The
regressors need the targets ``depth`` steps back: a ring of them (depth = 2 x the longest
season + 2), newest first.
"""
from __future__ import annotations

import jax.numpy as jnp

__all__ = ["init", "restart", "back", "scale", "features", "predict", "update", "D"]

D = 7       # regressors
CLIP = 2.5  # each regressor, a change in units of the changes' RMS, is clipped to +-CLIP


def init(n: int, n_out: int, depth: int, dtype, delta: float = 0.1) -> dict:
    """State for ``n`` slots of ``n_out`` channels; ``depth``: how far back the ring reaches.

    Example::

        >>> import jax.numpy as jnp
        >>> s = init(1, 2, 14, jnp.float32)
        >>> s["P"].shape, s["ring"].shape
        ((1, 2, 7, 7), (1, 14, 2))
    """
    if not isinstance(depth, int) or depth < 4:
        raise ValueError(f"lagged RLS: depth must be an integer >= 4; got {depth!r}")
    eye = jnp.eye(D, dtype=dtype) / delta
    return {"n": jnp.zeros(n, jnp.int32), "ring": jnp.zeros((n, depth, n_out), dtype),
            "w": jnp.zeros((n, n_out, D), dtype), "P": jnp.broadcast_to(eye, (n, n_out, D, D)),
            "q": jnp.zeros((n, n_out), dtype), "p": jnp.zeros((n, n_out), jnp.int32)}


def restart(s: dict, season, ok, delta: float = 0.1) -> dict:
    """Start the fit afresh (w = 0, P = I / delta) where the season (N, C) it regresses on
    differs from the one it learnt with, where ``ok`` (N,): what it learnt before a season was
    found (or with another one) would otherwise weigh on its weights for about 1 / (1 - lam) steps.

    Example::

        >>> import jax.numpy as jnp
        >>> s = init(1, 1, 8, jnp.float32)
        >>> s = {**s, "w": s["w"] + 1.0}
        >>> float(restart(s, jnp.array([[3]]), jnp.array([True]))["w"].sum())
        0.0
    """
    new = (season > 0) & (s["p"] == 0) & ok[:, None]
    eye = jnp.eye(D, dtype=s["P"].dtype) / delta
    return {**s, "w": jnp.where(new[..., None], 0, s["w"]), "P": jnp.where(new[..., None, None], eye, s["P"]),
            "p": jnp.where(new, season, s["p"]).astype(jnp.int32)}


def back(s, lag):
    """y_{t-lag} (N, C) from the ring, for lags (N, C) in 1..depth (t: the next target).

    Example::

        >>> import jax.numpy as jnp
        >>> s = init(1, 1, 4, jnp.float32)
        >>> for v in [1., 2., 3.]:
        ...     s = update(s, jnp.zeros((1, 1, D)), jnp.array([[v]]), jnp.array([True]))
        >>> float(back(s, jnp.array([[3]]))[0, 0])
        1.0
    """
    return _pick(s["ring"], lag[..., None])[..., 0]


def _pick(ring, lags):
    """ring[:, lag - 1] (N, C, L) for lags (N, C, L) (0 where a lag is outside 1..depth): the
    ring holds y_{t-1}, y_{t-2}, .. in order."""
    R = ring.shape[1]
    got = jnp.take_along_axis(jnp.swapaxes(ring, 1, 2), jnp.clip(lags - 1, 0, R - 1), axis=2)
    return jnp.where((lags >= 1) & (lags <= R), got, 0)


def _diffs(s, lags):
    """d_{t-lag} = y_{t-lag} - y_{t-lag-1} (N, C, L), 0 where lag is 0 or not yet seen."""
    ring = s["ring"]
    ok = (lags >= 1) & (s["n"][:, None, None] >= lags + 1) & (lags < ring.shape[1])
    return jnp.where(ok, _pick(ring[:, :-1] - ring[:, 1:], lags), 0)


def scale(s: dict):
    """(N, C): the changes' running root mean square s (a tiny floor where none is known).

    Example::

        >>> import jax.numpy as jnp
        >>> float(scale(init(1, 1, 8, jnp.float64))[0, 0]) > 0
        True
    """
    last = s["ring"][:, 0]
    return jnp.sqrt(s["q"] + 1e-12 * (1.0 + last * last))


def features(s: dict, p1, p2):
    """z (N, C, D) for the next target, from the ring and the seasons p1, p2 (N, C).

    Example::

        >>> import jax.numpy as jnp
        >>> s = init(1, 1, 8, jnp.float32)
        >>> features(s, jnp.zeros((1, 1), int), jnp.zeros((1, 1), int)).shape
        (1, 1, 7)
    """
    sc = scale(s)
    p1, p2 = jnp.minimum(p1, s["ring"].shape[1] - 1), jnp.minimum(p2, s["ring"].shape[1] - 1)
    on = jnp.where(p1 > 0, 1, 0)                                          # (0: no regressor)
    lags = jnp.stack([1 + 0 * p1, 2 + 0 * p1, p1, on * (p1 + 1), on * (p1 + 2), p2, on * 2 * p1], axis=-1)
    return jnp.clip(_diffs(s, lags) / sc[..., None], -CLIP, CLIP)


def predict(s: dict, z):
    """The expert's forecast (N, C) of the next target: y_{t-1} + s w^T z.

    Example::

        >>> import jax.numpy as jnp
        >>> s = init(1, 1, 8, jnp.float32)
        >>> float(predict(s, jnp.ones((1, 1, D)))[0, 0])      # nothing learnt yet: persistence (0)
        0.0
    """
    return s["ring"][:, 0] + scale(s) * jnp.sum(s["w"] * z, axis=-1)


def update(s: dict, z, y, ok, lam: float = 0.995, window: int = 500) -> dict:
    """Learn target y (N, C) where ``ok`` (N,), from the features z (N, C, D) it was forecast
    from; then y enters the ring.

    Example::

        >>> import jax.numpy as jnp
        >>> s = init(1, 1, 8, jnp.float32)
        >>> s = update(s, jnp.zeros((1, 1, D)), jnp.ones((1, 1)), jnp.array([True]))
        >>> int(s["n"][0])
        1
    """
    Pz = jnp.einsum("ncij,ncj->nci", s["P"], z)
    k = Pz / (lam + jnp.sum(z * Pz, axis=-1, keepdims=True))
    d = y - s["ring"][:, 0]
    e = d / scale(s) - jnp.sum(s["w"] * z, axis=-1)
    learn = (ok & (s["n"] >= 2))[:, None]
    w = jnp.where(learn[..., None], s["w"] + k * e[..., None], s["w"])
    P = jnp.where(learn[..., None, None], (s["P"] - k[..., :, None] * Pz[..., None, :]) / lam, s["P"])
    a = jnp.maximum(1.0 / jnp.maximum(s["n"], 1), 1.0 / window)[:, None].astype(y.dtype)
    q = jnp.where((ok & (s["n"] >= 1))[:, None], s["q"] + a * (d * d - s["q"]), s["q"])
    ring = jnp.concatenate([y[:, None, :], s["ring"][:, :-1]], axis=1)     # y_{t-1}, y_{t-2}, ..
    return {**s, "n": jnp.where(ok, s["n"] + 1, s["n"]), "w": w, "P": P, "q": q,
            "ring": jnp.where(ok[:, None, None], ring, s["ring"])}
