"""The period of a stream, found online: an autocorrelation of its deviations from a running level.

Per slot and channel, from the targets y_t as they arrive (past data only):

    d_t   = y_t - l_{t-1}                          the deviation from the running level l (a trend
    l_t   = l_{t-1} + b_t (y_t - l_{t-1})           leaves a constant), b = max(1/k, 1/max_period)
                                                   after k targets: a mean over about one season
    mu    <- mu  + a_t (d_t - mu)                  their running mean (the drift)
    v     <- v   + a_t (d_t^2 - v)                 their running second moment
    c_p   <- c_p + a_{t,p} (d_t d_{t-p} - c_p)     lag p's running product, p = 1..max_period
    r_p   = (c_p - mu^2) / (v - mu^2)              lag p's autocorrelation

with a = max(1/k, 1/window) after k products (a plain mean, then an exponential average: the
memory is bounded by ``window`` steps and a ring of the last ``max_period`` deviations).

A lag p in 2..max_period-1 is a candidate season when r_p is a local maximum (r_p >= r_{p-1},
r_p >= r_{p+1}), exceeds ``threshold``, rises ``prominence`` above the lowest r before it and
has at least p products behind it (two cycles seen).
Of the candidates, the strongest one (largest r) is ``best``;

    first  = the shortest candidate whose r is at least ``share`` x r_best   (the base season)
    second = best, where r_best exceeds r_first by ``margin``                 (a longer season)

and none at all unless the base season repeats: from 8 cycles of it on (8 x first differences
seen), r_{2 first} must exceed ``repeat`` where 2 first <= max_period (a cycle whose length
wanders, as the sunspots' 9-14 years, correlates at one cycle and much less at two; its
multiples are no season either; before 8 cycles r_{2 first} rests on too few products).

so a single season of 12 (whose multiples 24, 36 correlate as well) reports 12 and no second,
and half-hourly data with a day and a week reports 48 and 336. White noise reports none (0):
its deviations correlate about 0 beyond the first lags.

``settle`` keeps the seasons the experts use (``found``): it runs the search above only every
``every`` targets (per slot, on its k-th target with k a multiple of ``every``; the running
products are updated every step) and adopts a result only once ``hold`` searches in a row
agree on it (hysteresis), so a season that wins one search and loses the next never reaches
the experts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .slotwise import when_due

__all__ = ["init", "parts", "update", "autocorrelation", "periods", "settle", "found"]


def init(n: int, n_out: int, max_period: int, dtype) -> dict:
    """The detector's state for ``n`` slots of ``n_out`` channels, lags 1..``max_period``:
    ``k`` the targets seen, ``f`` (n, 2 max_period + 3, n_out) its running values in one
    array (rows: the ring of deviations d_{t-1}, d_{t-2}, .., lag p's product c_p for p = 1..
    max_period, mu, v, the level), ``lags`` (n, 5, n_out) int: the seasons found (first,
    second), the last search's (first, second) and how many searches in a row gave it.
    One array of each (``parts`` opens them): the step updates each in one kernel.

    Example::

        >>> import jax.numpy as jnp
        >>> s = init(1, 1, 24, jnp.float32)
        >>> parts(s)["c"].shape
        (1, 24, 1)
    """
    if not isinstance(max_period, int) or isinstance(max_period, bool) or max_period < 2:
        raise ValueError(f"period detector: max_period must be an integer >= 2; got {max_period!r}")
    return {"k": jnp.zeros(n, jnp.int32), "f": jnp.zeros((n, 2 * max_period + 3, n_out), dtype),
            "lags": jnp.zeros((n, 5, n_out), jnp.int32)}


def parts(s: dict) -> dict:
    """The state's parts by name: ``k``; ``ring``, ``c`` (N, max_period, C), ``mu``, ``v``,
    ``prev`` (N, C) from ``f``; ``found``, ``cand`` (N, 2, C), ``held`` (N, C) from ``lags``.

    Example::

        >>> import jax.numpy as jnp
        >>> sorted(parts(init(1, 1, 4, jnp.float32)))
        ['c', 'cand', 'found', 'held', 'k', 'mu', 'prev', 'ring', 'v']
    """
    f, lags = s["f"], s["lags"]
    P = (f.shape[1] - 3) // 2
    return {"k": s["k"], "ring": f[:, :P], "c": f[:, P:2 * P], "mu": f[:, 2 * P], "v": f[:, 2 * P + 1],
            "prev": f[:, 2 * P + 2], "found": lags[:, 0:2], "cand": lags[:, 2:4], "held": lags[:, 4]}


def update(s: dict, y, ok, window: int) -> dict:
    """Learn target ``y`` (N, C) where ``ok`` (N,); ``k`` counts the targets seen.

    Example::

        >>> import jax.numpy as jnp, numpy as np
        >>> s = init(1, 1, 4, jnp.float64)
        >>> for v in [0., 1., 0., 1., 0.]:
        ...     s = update(s, jnp.array([[v]]), jnp.array([True]), 100)
        >>> int(s["k"][0])
        5
    """
    f, k = s["f"], s["k"]
    R = f.shape[1]
    P = (R - 3) // 2
    m = k - 1                                       # differences seen before this one
    have = (k >= 1)[:, None]
    d = jnp.where(have, y - f[:, 2 * P + 2], 0).astype(f.dtype)
    # every row of f at once (one elementwise pass, one kernel): row r holds ring[r] for r < P,
    # c_p (p = r - P + 1) for P <= r < 2P, then mu, v and the level
    row = jnp.arange(R)[None, :, None]
    count = m[:, None, None] - (row - P + 1) + 1                               # lag p's products incl. this
    # each row's rate, divided per row (a rate all rows share, one division per slot, XLA
    # computes in a kernel of its own): lag p's max(1/count, 1/window), mu's and v's
    # a = max(1/k, 1/window) after k targets, the level's b = max(1/(k + 1), 1/max_period)
    kk = jnp.broadcast_to(k[:, None, None], count.shape)
    den = jnp.where(row < 2 * P, jnp.maximum(count, 1), jnp.where(row < 2 * P + 2, jnp.maximum(kk, 1), kk + 1))
    rate = jnp.maximum(1.0 / den, jnp.where(row == 2 * P + 2, 1.0 / P, 1.0 / window)).astype(d.dtype)
    D = d[:, None, :]
    shift = lambda n: jnp.pad(f[:, :R - n], ((0, 0), (n, 0), (0, 0)))          # row r: f's row r - n
    use = (have & ok[:, None])[:, None, :]
    new = jnp.where(row < P, jnp.where(row == 0, D, shift(1)),                  # the ring: d_t first
          jnp.where(row < 2 * P, f + rate * (D * shift(P) - f),                 # c_p: ring[p - 1] = d_{t-p}
          jnp.where(row == 2 * P, f + rate * (D - f),                            # mu
          jnp.where(row == 2 * P + 1, f + rate * (D * D - f), f + rate * (y[:, None, :] - f)))))    # v, the level
    keep = jnp.where(row < P, use, jnp.where(row < 2 * P, use & (count >= 1), jnp.where(row < 2 * P + 2, use, ok[:, None, None])))
    return {**s, "k": jnp.where(ok, k + 1, k), "f": jnp.where(keep, new, f)}


def autocorrelation(s: dict):
    """(N, max_period, C): r_p for p = 1..max_period (0 where lag p has no product yet).

    Example::

        >>> import jax.numpy as jnp
        >>> autocorrelation(init(1, 1, 3, jnp.float32)).shape
        (1, 3, 1)
    """
    s = parts(s)
    P = s["c"].shape[1]
    mu2 = (s["mu"] * s["mu"])[:, None, :]
    den = s["v"][:, None, :] - mu2
    seen = ((s["k"] - 1)[:, None] - jnp.arange(1, P + 1)[None, :] >= 1)[..., None]     # products
    ok = seen & (den > 1e-12 * (1.0 + s["v"][:, None, :]))
    return jnp.where(ok, (s["c"] - mu2) / jnp.where(ok, den, 1.0), 0.0)


def periods(s: dict, threshold: float = 0.3, share: float = 0.5, margin: float = 0.1, prominence: float = 0.3,
            repeat: float = 0.5):
    """The detected seasons (first, second), each (N, C) int32 lags (0: none), see the module.

    Example::

        >>> import jax.numpy as jnp, numpy as np
        >>> s = init(1, 1, 20, jnp.float64)
        >>> for v in np.tile([0., 0., 1., 3., 1.], 20):
        ...     s = update(s, jnp.array([[v]]), jnp.array([True]), 200)
        >>> [int(p[0, 0]) for p in periods(s)]
        [5, 0]
    """
    r = autocorrelation(s)                                              # lags 1..P
    P = r.shape[1]
    lag = jnp.arange(1, P + 1)[None, :, None]
    # lag p's left neighbour r_{p-1}; lag 1 has none and is no candidate (lag >= 2 below), so
    # its slot repeats r_1 (a constant there becomes a copy IREE runs before the step)
    left = jnp.concatenate([r[:, :1], r[:, :-1]], axis=1)
    right = jnp.concatenate([r[:, 1:], jnp.full_like(r[:, :1], jnp.inf)], axis=1)
    enough = ((s["k"] - 1)[:, None, None] - lag) >= lag                # two cycles seen
    # above the lowest before it: a running minimum as a scan of pairwise minima (log2 P rounds of
    # slices, elementwise), which XLA CPU runs in less time than lax.cummin's windowed reduction
    dip = r - jax.lax.associative_scan(jnp.minimum, r, axis=1)
    cand = (lag >= 2) & (r >= left) & (r >= right) & (r > threshold) & (dip > prominence) & enough
    rc = jnp.where(cand, r, -jnp.inf)
    best = jnp.argmax(rc, axis=1)                                       # (N, C) index
    r_best = jnp.max(rc, axis=1)
    first = jnp.argmax(cand & (r >= share * r_best[:, None, :]), axis=1)
    r_first = jnp.take_along_axis(r, first[:, None, :], axis=1)[:, 0]
    half = jnp.concatenate([r[:, 1::2][:, :P // 2], jnp.full_like(r[:, :P - P // 2], jnp.inf)], axis=1)
    young = (s["k"] - 1)[:, None] < 8 * (first + 1)                     # too few cycles to judge r_{2 first}
    again = young | (jnp.take_along_axis(half, first[:, None, :], axis=1)[:, 0] > repeat)    # r_{2 first}
    any_ = (r_best > -jnp.inf) & again                                  # any candidate (jnp.any: 2 kernels)
    two = any_ & (best != first) & (r_best > r_first + margin)
    return (jnp.where(any_, first + 1, 0).astype(jnp.int32), jnp.where(two, best + 1, 0).astype(jnp.int32))


def settle(s: dict, ok, every: int = 4, hold: int = 2) -> dict:
    """Search the seasons (``periods``) where ``ok`` (N,) and the slot's target count is a
    multiple of ``every``; adopt a search's result into ``found`` once ``hold`` searches in a
    row gave it. The search runs under a branch (``slotwise.when_due``): a step where no slot
    is due skips it (in the engine's vmapped step it runs every step, its result selected).

    Example::

        >>> import jax.numpy as jnp, numpy as np
        >>> s = init(1, 1, 20, jnp.float64)
        >>> for v in np.tile([0., 0., 1., 3., 1.], 20):
        ...     s = settle(update(s, jnp.array([[v]]), jnp.array([True]), 200), jnp.array([True]))
        >>> [int(p) for p in found(s)[0][0]], [int(p) for p in found(s)[1][0]]
        ([5], [0])
    """
    def search(due, s):
        first, second = periods(s)
        got = jnp.stack([first, second], axis=1)                        # (N, 2, C)
        o = parts(s)
        same = jnp.all(got == o["cand"], axis=1)
        held = jnp.where(same, o["held"] + 1, 1)
        adopt = (held >= hold)[:, None, :]
        d2, d1 = due[:, None, None], due[:, None]
        lags = [jnp.where(d2 & adopt, got, o["found"]), jnp.where(d2, got, o["cand"]),
                jnp.where(d1, held, o["held"])[:, None]]
        return {**s, "lags": jnp.concatenate(lags, axis=1)}
    return when_due(search, ok & (s["k"] % every == 0), s)


def found(s: dict):
    """The seasons ``settle`` adopted: (first, second), each (N, C) int32 (0: none).

    Example::

        >>> import jax.numpy as jnp
        >>> [int(p[0, 0]) for p in found(init(1, 1, 12, jnp.float32))]
        [0, 0]
    """
    return s["lags"][:, 0], s["lags"][:, 1]
