"""The experts' mixture at every lead of a forecast H steps ahead.

``Experts`` (learner/experts.py) mixes the next value. A learner with ``Forecast(horizon=H)``
also forecasts y_{t+2} .. y_{t+H} (the model's rollout, learner/step.py); ``LeadExperts`` mixes
each of those leads h = 2..H with simple experts of its own, weighted by their losses *at that
lead*, so a rollout that goes astray at the far leads gives way there to what forecasts them
better:

    model         the model's rollout at lead h
    persistence   y_t, the last target
    mean          the targets' running mean
    seasonal      y_{t+h-kp}, k = ceil(h / p): the same phase a season back from the last value
                  seen, with the season p the seasonal expert uses (set or detected); none
                  without one

Each origin's forecasts (the experts' and the mixture's) wait in a ring until their targets
arrive: lead h's forecasts made at origin t are scored on y_{t+h}, h steps later, with lead 1's
loss (the squared error over the targets' running variance before y_{t+h}, clipped; an expert
that could not forecast charged the mixture's own loss; nothing charged before two targets)
into

    L_{h,k} <- beta L_{h,k} + l_{h,k},   w_{h,k} = softmax_k(-eta L_{h,k})

with lead 1's eta, clip and memory (beta = 1 - 1/tau, tau = min(window, 10 + n/4)). Lead 1 is
``Experts`` itself, unchanged. The targets' statistics and the seasons are lead 1's: the
per-lead state is the ring of pending forecasts and the losses.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import lagged_rls

__all__ = ["LeadExperts", "over_leads", "LEAD_EXPERTS"]

LEAD_EXPERTS = ("model", "persistence", "mean", "seasonal")


class LeadExperts:
    """``Experts`` at every lead of a horizon (see the module docstring): lead 1 by ``experts``,
    leads 2..``horizon`` by per-lead weights over the model's rollout and the simple experts.
    State: ``experts``' own, and ``leads``: ``L`` (N, H-1, K, C) the discounted losses per lead,
    ``ring`` (N, H, H-1, K+1, C) the forecasts (the K experts' and the mixture's) of the last H
    origins, newest first, and ``made`` (the same shape) 1 where a forecast was made (the
    state holds no NaN: the learner's rollback gate undoes a step that leaves one).

    Parameters
    ----------
    experts : Experts
        The mixture of the next value (its settings serve every lead).
    horizon : int
        The number of values forecast, >= 2.

    Example::

        >>> import numpy as np, streamtrace as st
        >>> e = LeadExperts(st.experts(period=4), 3)
        >>> s = e.init(1, 1, np.float32)
        >>> s["leads"]["L"].shape, s["leads"]["ring"].shape
        ((1, 2, 4, 1), (1, 3, 2, 5, 1))
    """

    def __init__(self, experts, horizon: int):
        if not isinstance(horizon, int) or horizon < 2:
            raise ValueError(f"lead experts: horizon must be an integer >= 2; got {horizon!r}")
        self.experts, self.horizon = experts, horizon
        self.names = LEAD_EXPERTS if experts.period else LEAD_EXPERTS[:3]

    @property
    def period(self):
        """The longest season the experts know or detect (None: no seasonal expert)."""
        return self.experts.period

    # ---- what a learner asks of a combiner -------------------------------------------------
    def describe(self) -> dict:
        return {**self.experts.describe(), "leads": self.horizon, "lead_experts": list(self.names)}

    def init(self, n: int, n_out: int, dtype) -> dict:
        H, K = self.horizon, len(self.names)
        ring = jnp.zeros((n, H, H - 1, K + 1, n_out), dtype)
        leads = {"L": jnp.zeros((n, H - 1, K, n_out), dtype), "ring": ring, "made": ring}
        return {**self.experts.init(n, n_out, dtype), "leads": leads}

    def seasons_of(self, named: dict):
        return self.experts.seasons_of(named)

    def season_columns(self, n_out: int, dtype):
        return self.experts.season_columns(n_out, dtype)

    # ---- the step ---------------------------------------------------------------------------
    def forecast_leads(self, s, y_now, scored, seen, preds, keep):
        """Forecast step over every lead: lead 1 as ``Experts.forecast`` (``preds[0]``); then,
        where ``seen`` (y_now (N, C) arrived), score the forecasts whose target it is and mix
        ``preds[1:]`` (each (N, *out): the model's rollout, valid where ``keep``) with the simple
        experts. Returns (state, the forecasts, one per lead)."""
        before = self.experts.open(_first(s))            # the targets' statistics before y_now
        first, lead1 = self.experts.forecast(_first(s), y_now, scored, seen, preds[0], keep)
        after = self.experts.open(first)                  # ... and with it: the forecasts' origin
        y = jnp.where(seen[:, None], y_now.reshape(y_now.shape[0], -1), 0).astype(before["L"].dtype)
        lead = self._score(s["leads"], before, y, seen)
        model = jnp.stack([p.reshape(p.shape[0], -1) for p in preds[1:]], axis=1)
        fc = self._forecasts(after, jnp.where(keep[:, None, None], model, jnp.nan))
        mixed = self._mix(lead["L"], fc)
        row = jnp.concatenate([fc, mixed[:, :, None]], axis=2)               # (N, H-1, K+1, C)
        made = jnp.isfinite(row)
        shift = lambda new, old: jnp.where(seen[:, None, None, None, None],
                                           jnp.concatenate([new[:, None], old[:, :-1]], axis=1), old)
        lead = {"L": lead["L"], "ring": shift(jnp.where(made, row, 0), lead["ring"]),
                "made": shift(made.astype(row.dtype), lead["made"])}
        # where the rollout is missing the mixture of the others stands (all missing: the rollout)
        mixed = jnp.where(jnp.isfinite(mixed), mixed, model).astype(preds[1].dtype)
        out = [m.reshape(preds[1].shape) for m in jnp.moveaxis(mixed, 1, 0)]
        return {**first, "leads": lead}, [lead1] + out

    def _forecasts(self, e, model):
        """(N, H-1, K, C): every expert's forecast of leads 2..H from the last target, NaN where
        one cannot forecast; ``model`` (N, H-1, C) the rollout."""
        n = e["n"][:, None, None]
        hs = jnp.arange(2, self.horizon + 1)[None, :, None]                 # (1, H-1, 1)
        out = [model,
               jnp.where(n >= 1, jnp.broadcast_to(e["last"][:, None], model.shape), jnp.nan),
               jnp.where(n >= 1, jnp.broadcast_to(e["mean"][:, None], model.shape), jnp.nan)]
        if self.period:
            p = self.experts.in_use(e)[0][:, None]                           # (N, 1, C)
            q = jnp.maximum(p, 1)
            back = q * ((hs + q - 1) // q) - hs + 1                            # y_{t+h-kp}: back - 1 steps before y_t
            got = jnp.stack([lagged_rls.back(e["linear"], back[:, i]) for i in range(self.horizon - 1)], axis=1)
            out.append(jnp.where((p > 0) & (n >= back), got, jnp.nan))
        return jnp.stack(out, axis=2).astype(model.dtype)

    def _mix(self, L, fc):
        """(N, H-1, C): each lead's mixture of the forecasts ``fc`` (N, H-1, K, C)."""
        avail = jnp.isfinite(fc)
        w = jax.nn.softmax(jnp.where(avail, -self.experts.eta * L, -jnp.inf), axis=2)
        return jnp.sum(w * jnp.where(avail, fc, 0), axis=2)

    def _score(self, lead, e, y, seen):
        """Charge each lead's experts their loss on y (N, C), the target of lead h's forecasts
        made h steps ago (ring row h - 1, lead index h - 2), where ``seen`` and such forecasts
        were made; ``e``: lead 1's state before y (the targets' statistics as lead 1 uses them)."""
        rows = jnp.arange(1, self.horizon)
        due = jnp.where(lead["made"][:, rows, rows - 1] > 0, lead["ring"][:, rows, rows - 1], jnp.nan)   # (N, H-1, K+1, C)
        fc, mixed = due[:, :, :-1], due[:, :, -1:]
        scale = e["var"][:, None, None] + 1e-12 * (1.0 + e["mean"][:, None, None] ** 2)
        clip = self.experts.clip
        d = fc - y[:, None, None]
        loss = jnp.minimum(d * d / scale, clip)
        asleep = jnp.minimum((mixed - y[:, None, None]) ** 2 / scale, clip)
        loss = jnp.where(jnp.isfinite(loss), loss, asleep)
        m0, m1 = self.experts.memory
        tau = jnp.minimum(self.experts.window, m0 + m1 * e["n"])[:, None, None, None]
        L = (1.0 - 1.0 / tau) * lead["L"] + loss
        charge = seen[:, None, None, None] & (e["n"] >= 2)[:, None, None, None] & jnp.isfinite(asleep)
        return {**lead, "L": jnp.where(charge, L, lead["L"]).astype(lead["L"].dtype)}


def _first(s: dict) -> dict:
    return {k: v for k, v in s.items() if k != "leads"}


def over_leads(combine, horizon: int):
    """The combiner a learner forecasting ``horizon`` values uses: ``combine`` itself for one
    value, else ``LeadExperts`` mixing every lead.

    Parameters
    ----------
    combine : Experts or None
        The learner's experts' mixture.
    horizon : int
        The values forecast each step.

    Returns
    -------
    Experts, LeadExperts or None

    Example::

        >>> import streamtrace as st
        >>> type(over_leads(st.experts(), 1)).__name__, type(over_leads(st.experts(), 3)).__name__
        ('Experts', 'LeadExperts')
    """
    if combine is None or horizon == 1:
        return combine
    return LeadExperts(combine, horizon)
