"""Never worse than persistence: an online mixture of the model's forecast with simple experts.

Per slot and per predicted channel, the prediction a user gets is a weighted average of K
experts' predictions of the next target y_t:

    model         what the learner predicts (user units, after the signal transforms)
    persistence   the last target, y_{t-1}
    mean          a running mean of the targets (1/n while n < window, then an exponential
                  average with rate 1/window)
    seasonal      y_{t-period}, when ``period`` is set (a ring buffer of past targets);
                  with ``max_period`` instead, the period is detected online (learner/period.py:
                  an autocorrelation over a bounded memory, per channel, past data only) and
                  the seasonal expert uses the longer of the (one or two) seasons found; where
                  none is found it cannot predict (no weight)
    linear        with a period (set or detected): recursive least squares with forgetting 0.99
                  on the last changes and the changes a season (and two seasons) back
                  (learner/lagged_rls.py; persistence until it has learnt, the seasonal naive
                  forecast with drift within reach; with detection its fit starts afresh when
                  the first season is found)

weighted by their recent prequential losses with the exponentially weighted average
forecaster (EWA, Vovk; Littlestone & Warmuth's weighted majority for real predictions):

    l_{k,t} = min((p_{k,t} - y_t)^2 / s_t^2, clip)       s_t^2: the targets' running variance
                                                            before y_t (loss in std units)
    L_{k,t} = beta_t L_{k,t-1} + l_{k,t}                  beta_t = 1 - 1/tau_t (forgetting),
                                                            tau_t = min(window, 10 + n_t / 4)
    w_{k,t+1} = exp(-eta L_{k,t}) / sum_j exp(-eta L_{j,t})
    prediction_{t+1} = sum_k w_{k,t+1} p_{k,t+1}

with n_t the targets seen: the losses' memory grows with the stream (14 steps after 16
targets, 46 after 144, ``window`` from 4 (window - 10) targets on), so on a short series the
expert that is best lately leads, not the one that was best over its first steps.
Every weight uses past targets only, so the mixture is a causal forecaster itself. An expert
that cannot predict yet (no target seen; no season for the seasonal one) has no weight and is
charged the mixture's own loss (a sleeping expert, Freund, Schapire, Singer & Warmuth 1997):
its standing against the others is what it was when it fell asleep, so an expert that joins
late (the seasonal and linear ones, once a season is found) is neither favoured nor locked
out. Until the variance is known (two targets) no loss is charged at all.

Regret bound (Cesa-Bianchi & Lugosi, "Prediction, Learning, and Games", 2006, thm. 2.2): for
losses in [0, B] (here B = clip) and no forgetting (beta = 1), over any T steps and for any
sequence of targets,

    sum_t sum_k w_{k,t} l_{k,t}  <=  min_k sum_t l_{k,t}  +  ln(K) / eta  +  eta T B^2 / 8,

and since the squared error is convex, the mixture's own (unclipped, normalised) squared
error is at most the weighted loss on the left wherever no loss was clipped. So over a
stream the mixture is at most ln(K)/eta + eta T B^2/8 worse than the best of the model,
persistence, the mean and the seasonal naive forecast *chosen in hindsight*. (For a fixed
eta that is linear in T; eta = sqrt(8 ln K / T) / B makes it sqrt(T ln(K) / 2) B. We use a
larger eta and forgetting instead: the best expert changes over a stream, the model becoming
good after its warm-up, and with beta < 1 the weights follow the best expert over the last
~window steps; the guarantee above is for beta = 1 only.)
"""
from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np

from . import flat_state, lagged_rls
from . import period as seasons
from .slotwise import apart, slotwise

__all__ = ["Experts", "experts", "EXPERTS"]

EXPERTS = ("model", "persistence", "mean", "seasonal", "linear")
# the state's layout, in describe() (so in a checkpoint's signature): a checkpoint of another
# layout is told by name ("combine.state: expected ..."), not by a list of arrays, and resumes
# with a fresh mixture (learner/mixture_upgrade.py)
STATE = "aux-3: linear 7 regressors on changes, seasons settled, detector stacked"


class Experts:
    """The combiner (see the module docstring). ``forecast`` and ``supervised`` are the two ways
    the learner's step calls it; state per slot: ``L`` (N, K, C) discounted losses, ``n``
    targets seen and ``aux`` (the rest, one array per dtype; ``open`` names its parts):
    ``last``, ``mean``, ``var`` (N, C), ``model`` (N, C) the model's pending forecast; with a
    period ``linear`` (learner/lagged_rls.py's state: its ring of targets serves the seasonal
    expert too) and, when detecting it, ``season`` (learner/period.py's state).

    Example::

        >>> import numpy as np
        >>> e = Experts(max_period=24)
        >>> s = e.init(1, 1, np.float32)
        >>> sorted(e.open(s)["season"])
        ['f', 'k', 'lags']
    """

    name = "experts"

    def __init__(self, period: int | None = None, *, eta: float = 8.0, window: int = 500, clip: float = 4.0,
                 max_period: int | None = None):
        for key, v in (("period", period), ("max_period", max_period)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 2):
                raise ValueError(f"experts: {key} must be an integer >= 2 (or None); got {v!r}")
        if period and max_period:
            raise ValueError("experts: give period (known) or max_period (detect it), not both")
        if not (isinstance(eta, (int, float)) and eta > 0 and eta < float("inf")):
            raise ValueError(f"experts: eta (learning rate of the weights) must be a finite number > 0; got {eta!r}")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"experts: window must be an integer >= 1 (steps); got {window!r}")
        if not (isinstance(clip, (int, float)) and clip > 0 and clip < float("inf")):
            raise ValueError(f"experts: clip (the loss bound B) must be a finite number > 0; got {clip!r}")
        self.detect = bool(max_period)
        self.period = period or max_period        # the longest season
        self.eta, self.window, self.clip = float(eta), window, float(clip)
        self.names = EXPERTS if self.period else EXPERTS[:3]
        self.lam = 0.99             # the linear expert's forgetting (fast: short series)
        self.memory = (10.0, 0.25)  # the losses' memory: 10 + n / 4 steps after n targets, at most window
        self.search = (4, 2)        # the seasons searched every 4 targets, adopted when 2 searches agree

    def describe(self) -> dict:
        return {"kind": self.name, "experts": list(self.names), "period": None if self.detect else self.period,
                "max_period": self.period if self.detect else None, "eta": self.eta, "window": self.window,
                "clip": self.clip, "state": STATE}

    def init(self, n: int, n_out: int, dtype) -> dict:
        return {"L": jnp.zeros((n, len(self.names), n_out), dtype), "n": jnp.zeros(n, jnp.int32),
                "aux": flat_state.flatten(self._aux(n, n_out, dtype))}

    def _aux(self, n, n_out, dtype) -> dict:
        """The state besides L and n, kept as one array per dtype (``aux``, learner/flat_state.py:
        each array of the state costs the step about a microsecond)."""
        z = jnp.zeros((n, n_out), dtype)
        aux = {"last": z, "mean": z, "var": z, "model": z}
        if self.detect:     # the period detector over lags 1..max_period
            aux["season"] = seasons.init(n, n_out, self.period, dtype)
        if self.period:     # the linear expert (its ring of targets reaches a season and 2 more steps back)
            aux["linear"] = lagged_rls.init(n, n_out, 2 * self.period + 2, dtype)
        return aux

    def open(self, s) -> dict:
        """The state ``init`` made (``L``, ``n``, ``aux``) with ``aux`` opened into its parts:
        ``last``, ``mean``, ``var``, ``model`` and with a period ``linear`` (and ``season``)."""
        like = jax.eval_shape(lambda: self._aux(1, s["L"].shape[2], s["L"].dtype))
        return {"L": s["L"], "n": s["n"], **flat_state.unflatten(s["aux"], like)}

    def _close(self, s) -> dict:
        return {"L": s["L"], "n": s["n"], "aux": flat_state.flatten({k: v for k, v in s.items() if k not in ("L", "n")})}

    def in_use(self, s):
        """(N, C) the season the seasonal expert uses and the other one found (0: none), of the
        opened state ``s`` (``open``; the experts at later leads read it too)."""
        if not self.detect:
            p = jnp.full(s["last"].shape, self.period, jnp.int32)
            return p, jnp.zeros_like(p)
        first, second = seasons.found(s["season"])
        return jnp.where(second > 0, second, first), jnp.where(second > 0, first, 0)

    def seasons_of(self, named: dict):
        """The seasons the experts use, per slot and channel, from the combiner's state by name
        (``{"L": .., "n": .., "aux": {..}}``, numpy or jax arrays): an int array (N, C, 2) of
        (the season the seasonal expert uses, the other one found), 0 where none. A known
        ``period`` is reported as found from the first step.

        Example::

            >>> import numpy as np
            >>> e = Experts(period=7)
            >>> e.seasons_of(e.init(2, 1, np.float32))[:, 0].tolist()
            [[7, 0], [7, 0]]
        """
        if not self.period:
            raise ValueError("experts: no seasons without a period or max_period")
        p, q = self.in_use(self.open(named))
        return np.stack([np.asarray(p), np.asarray(q)], axis=-1).astype(np.int64)

    def season_columns(self, n_out: int, dtype) -> dict | None:
        """Where ``seasons_of`` reads, for a reader without jax (the exported runner):
        ``{"period": p}`` for a known period; with detection ``{"first": [..], "second": [..]}``,
        the columns of the int part of ``aux`` (``aux["int"]``, (N, width)) that hold each
        channel's first and second season found; None without a season.

        Example::

            >>> import numpy as np
            >>> Experts(period=7).season_columns(1, np.float32)
            {'period': 7}
            >>> cols = Experts(max_period=12).season_columns(2, np.float32)
            >>> len(cols["first"]), len(cols["second"])
            (2, 2)
        """
        if not self.period:
            return None
        if not self.detect:
            return {"period": self.period}
        zero = self._aux(1, n_out, dtype)
        flat = {k: np.asarray(v) for k, v in flat_state.flatten(zero).items()}
        flat["int"] = np.arange(flat["int"].shape[1])[None]       # each column holding its own index
        cols = flat_state.unflatten(flat, zero)
        first, second = seasons.found(cols["season"])
        return {"first": [int(c) for c in first[0]], "second": [int(c) for c in second[0]]}

    def _linear(self, s):
        """The linear expert's regressors (N, C, D) for the next target."""
        p, q = self.in_use(s)
        return lagged_rls.features(s["linear"], p, q)

    def _seasonal(self, s):
        """The seasonal naive forecast (N, C) and (N, C) whether it exists: y_{t-period}, or with a
        detected period y_{t-p}, p the longer season found so far (per channel)."""
        p, _ = self.in_use(s)
        return lagged_rls.back(s["linear"], jnp.maximum(p, 1)), (p > 0) & (s["n"][:, None] >= p)

    def _experts(self, s, model):
        """The K experts' predictions of the next target and whether each can predict: two
        lists of K (N, C) arrays."""
        n = s["n"][:, None]
        preds = [model, s["last"], s["mean"]]
        avail = [jnp.isfinite(jnp.sum(model, axis=-1))[:, None], n >= 1, n >= 1]
        if self.period:
            seasonal, has = self._seasonal(s)
            preds += [seasonal, lagged_rls.predict(s["linear"], self._linear(s))]
            avail += [has, (n >= 3) & (self.in_use(s)[0] > 0)]       # the linear one: with a season
        return preds, [jnp.broadcast_to(a, model.shape) for a in avail]

    def mix(self, s, model):
        """The combined prediction (N, C) of ``model`` (N, C) and the simple experts."""
        if self.period:
            return self._mix_each(s, model)
        preds, avail = (jnp.stack(v, axis=1) for v in self._experts(s, model))
        logits = jnp.where(avail, -self.eta * s["L"], -jnp.inf)
        w = jax.nn.softmax(logits, axis=1)
        return jnp.sum(w * jnp.where(avail, preds, 0), axis=1).astype(model.dtype)

    def _score(self, s, model, y, scored):
        """Charge every expert its loss on target y (N, C) where ``scored`` (N,)."""
        if self.period:
            return self._score_each(s, model, y, scored)
        preds, avail = (jnp.stack(v, axis=1) for v in self._experts(s, model))
        d = preds - y[:, None, :]
        known = (s["n"] >= 2)[:, None, None]
        scale = s["var"][:, None, :] + 1e-12 * (1.0 + s["mean"][:, None, :] ** 2)
        loss = jnp.where(known, jnp.minimum(d * d / scale, self.clip), 0.0)
        w = jax.nn.softmax(jnp.where(avail, -self.eta * s["L"], -jnp.inf), axis=1)
        e = jnp.sum(w * jnp.where(avail, d, 0), axis=1, keepdims=True)          # the mixture's error
        asleep = jnp.where(known, jnp.minimum(e * e / scale, self.clip), 0.0)
        loss = jnp.where(avail & jnp.isfinite(loss), loss, jnp.where(jnp.isfinite(asleep), asleep, 0.0))
        tau = jnp.minimum(self.window, self.memory[0] + self.memory[1] * s["n"])[:, None, None]
        L = (1.0 - 1.0 / tau) * s["L"] + loss
        return {**s, "L": jnp.where(scored[:, None, None], L, s["L"]).astype(s["L"].dtype)}

    def _odds(self, s, avail):
        """The mixture's weights before they are normalised, and their sum: exp(x - max) for
        the available experts' x = -eta L (K lists of (N, C)), and the sum of those, left to right."""
        logits = [jnp.where(a, -self.eta * s["L"][:, k], -jnp.inf) for k, a in enumerate(avail)]
        top = functools.reduce(jnp.maximum, logits)
        ex = [jnp.exp(x - top) for x in logits]
        return ex, functools.reduce(operator.add, ex)

    def _weights(self, s, avail):
        """The mixture's weights (K lists of (N, C)): the softmax over the available experts
        of -eta L (as ``jax.nn.softmax``: exp(x - max) / the sum of those, left to right)."""
        ex, total = self._odds(s, avail)
        return [x / total for x in ex]

    def _mix_each(self, s, model):
        """``mix`` expert by expert (see ``_score_each``), normalised last: the sum of the
        experts' predictions times exp(x - max), over the sum of those. (Normalising each
        weight first, as the scoring does, made XLA compute each weight in a kernel of its own:
        the prediction has two consumers, the pending forecast and the step's output, and a
        division is not copied into two; one division last is one kernel for the mixture.)"""
        preds, avail = self._experts(s, model)
        ex, total = self._odds(s, avail)
        terms = [x * jnp.where(a, p, 0) for x, a, p in zip(ex, avail, preds)]
        return (functools.reduce(operator.add, terms) / total).astype(model.dtype)

    def _score_each(self, s, model, y, scored):
        """``_score`` of the seasonal combiner, expert by expert: elementwise arithmetic on (N, C)
        arrays that XLA fuses into a few kernels, where stacking the five experts into (N, K, C)
        and reducing over K makes a kernel of every stack, max and sum (and every kernel costs
        the one-slot step time, docs/quality.md "The step."); the same operations, each
        sum left to right as XLA's reduction adds, but fused otherwise: the numbers may differ
        in the last bit. The combiner without seasons keeps the stacked form (it has 3 experts,
        and its step was not slower for them)."""
        preds, avail = self._experts(s, model)
        known = (s["n"] >= 2)[:, None]
        scale = s["var"] + 1e-12 * (1.0 + s["mean"] ** 2)
        d = [p - y for p in preds]
        w = self._weights(s, avail)
        e = functools.reduce(operator.add, [wk * jnp.where(a, dk, 0) for wk, a, dk in zip(w, avail, d)])
        asleep = jnp.where(known, jnp.minimum(e * e / scale, self.clip), 0.0)     # the mixture's loss
        tau = jnp.minimum(self.window, self.memory[0] + self.memory[1] * s["n"])[:, None]
        L = []
        for k, (a, dk) in enumerate(zip(avail, d)):
            loss = jnp.where(known, jnp.minimum(dk * dk / scale, self.clip), 0.0)
            loss = jnp.where(a & jnp.isfinite(loss), loss, jnp.where(jnp.isfinite(asleep), asleep, 0.0))
            L.append((1.0 - 1.0 / tau) * s["L"][:, k] + loss)
        L = jnp.stack(L, axis=1)
        return {**s, "L": jnp.where(scored[:, None, None], L, s["L"]).astype(s["L"].dtype)}

    def _observe(self, s, y, ok):
        """Learn the targets' statistics (and the seasonal ring) from target y where ``ok``."""
        n1 = s["n"] + 1
        w = jnp.maximum(1.0 / n1, 1.0 / self.window)[:, None].astype(y.dtype)
        d = y - s["mean"]
        mean = s["mean"] + w * d
        var = (1.0 - w) * s["var"] + w * d * (y - mean)
        keep = ok[:, None]
        new = {**s, "n": jnp.where(ok, n1, s["n"]), "last": jnp.where(keep, y, s["last"]),
               "mean": jnp.where(keep, mean, s["mean"]), "var": jnp.where(keep, var, s["var"])}
        if self.detect:
            new["season"] = seasons.settle(seasons.update(s["season"], y, ok, self.window), ok, *self.search)
        if self.period:
            lin = lagged_rls.restart(s["linear"], self.in_use(s)[0], ok) if self.detect else s["linear"]
            new["linear"] = lagged_rls.update(lin, self._linear(s), y, ok, self.lam, self.window)
        return new

    # ---- the two ways a step uses it ---------------------------------------------------------
    def supervised(self, s, model, y, ok):
        """Supervised step: the mixture's prediction of this step's target from ``model`` (N, *out),
        then learn from the target y where ``ok`` (N,). Returns (state, prediction). Slot by
        slot (learner/slotwise.py): a vmapped step over slots runs it as one of all the slots."""
        return slotwise(self._supervised)(s, model, y, ok)

    def _supervised(self, s, model, y, ok):
        shape, m, t = model.shape, _flat(model), _flat(y)
        # the mixture apart: the reply-first prediction program computes it alone, bit for bit
        out = apart(lambda s, m: self.mix(self.open(s), m), s, m)
        s = self.open(s)
        t = jnp.where(ok[:, None], t, 0).astype(m.dtype)
        s = self._observe(self._score(s, m, t, ok), t, ok)
        return self._close(s), out.reshape(shape)

    def forecast(self, s, y_now, scored, seen, model, keep):
        """Forecast step: y_now (N, C) is the target of the pending forecast; charge the experts
        where ``scored``, learn y_now where ``seen``, then mix the model's next forecast ``model``
        (kept as pending where ``keep``). Returns (state, prediction). Slot by slot, as
        ``supervised``."""
        return slotwise(self._forecast)(s, y_now, scored, seen, model, keep)

    def _forecast(self, s, y_now, scored, seen, model, keep):
        shape, m = model.shape, _flat(model)
        y = jnp.where(seen[:, None], _flat(y_now), 0).astype(m.dtype)
        s = self.open(s)
        s = self._observe(self._score(s, s["model"], y, scored & seen), y, seen)
        s = {**s, "model": jnp.where(keep[:, None] & jnp.isfinite(m), m, s["model"])}
        return self._close(s), self.mix(s, m).reshape(shape)


def _flat(a):
    return a.reshape(a.shape[0], -1)


def experts(period: int | None = None, *, eta: float = 8.0, window: int = 500, clip: float = 4.0,
            max_period: int | None = None) -> Experts:
    """Mix the model's forecast with simple experts, weighted by their recent losses.

    The prediction a user gets is an online weighted average (exponentially weighted forecaster)
    of the model's prediction, persistence (the last value), a running mean and, with a season,
    the seasonal naive forecast and a seasonal linear one. Weights follow each expert's recent
    prequential loss, so the mixture is never much worse than the best of them: a young model
    does no harm, and a seasonal stream gets a seasonal forecast from the first season on.

    Parameters
    ----------
    period : int, optional
        A known season length in steps (>= 2). Not with ``max_period``.
    eta : float, default 8.0
        The learning rate of the weights (> 0): larger follows the best expert faster.
    window : int, default 500
        The forgetting of the losses and the running mean's time constant, in steps.
    clip : float, default 4.0
        The bound on a step's loss, in squared standard deviations of the target.
    max_period : int, optional
        Detect the season online in 2..``max_period`` steps instead of giving it.

    Returns
    -------
    Experts

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    >>> learner = st.OnlineLearner(model, np.zeros(1, np.float32), mode="forecast",
    ...                            combine=st.experts(period=4))
    >>> for t in range(12):
    ...     r = learner.step(np.array([t % 4], np.float32))
    >>> round(float(r.prediction[0]), 1)        # after 0, 1, 2, 3, 0, ...: the seasonal value
    0.0
    """
    return Experts(period, eta=eta, window=window, clip=clip, max_period=max_period)
