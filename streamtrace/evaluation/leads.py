"""Forecasts H steps ahead, scored per lead: ``evaluate --horizon H``.

A learner with ``Forecast(horizon=H)`` (``[learning] horizon = H``) returns at step t, having
seen the series up to y_t, its forecasts of y_{t+1} .. y_{t+H}. Lead h's score is the NRMSE of
the forecasts made h steps before their target, over the same forecast origins t for every lead
(the last ``window`` origins whose H targets all exist; a series too short: the second half of
them), beside the two simple forecasts at that lead on the same origins:

    persistence      y_{t+h} ~ y_t
    seasonal naive   y_{t+h} ~ y_{t+h-kp},  k = ceil(h / p): the same phase one season back
                     from the last value seen (with a period p; origins where it reaches before
                     the series' start are given persistence's forecast instead)
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import numpy as np

from .scoring import Progress, _effective_window, config_data, nrmse, task_config, with_channels
from .tasks import Task, get_task

__all__ = ["LeadScores", "score_leads", "naive_leads", "evaluate_leads", "format_leads"]


@dataclass
class LeadScores:
    """NRMSE per lead (index h - 1) of the forecasts and of the simple ones on the same origins."""
    horizon: int
    origins: tuple[int, int]                 # forecast origins t in [start, stop)
    nrmse: list[float]
    persistence: list[float]
    seasonal: list[float] | None = None      # with a period
    period: int = 0
    label: str = ""
    task: str = ""


def naive_leads(series, horizon: int, period: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """Persistence's and the seasonal naive forecasts (T, H, C) from every origin t of ``series``
    (T, C) (see the module docstring); the seasonal one is None without a period.

    Example::

        >>> p, s = naive_leads(np.arange(6.0)[:, None], 2, period=3)
        >>> p[4, :, 0].tolist(), s[4, :, 0].tolist()     # from y_4: y_4 twice; y_2, y_3
        ([4.0, 4.0], [2.0, 3.0])
    """
    y = np.asarray(series, np.float64).reshape(len(series), -1)
    T = len(y)
    pers = np.repeat(y[:, None, :], horizon, axis=1)
    if not period:
        return pers, None
    seas = pers.copy()
    for h in range(1, horizon + 1):
        back = h - period * math.ceil(h / period)            # <= 0: the same phase, a season back
        t = np.arange(T)
        ok = t + back >= 0
        seas[ok, h - 1] = y[t[ok] + back]
    return pers, seas


def score_leads(preds, series, horizon: int, *, window: int = 1000, period: int = 0) -> LeadScores:
    """Score forecasts ``preds`` (T, H, C) (``preds[t, h-1]`` forecasts ``series[t+h]``; step t
    has seen ``series[t]``) of ``series`` (T + 1, C) per lead, with the simple forecasts.

    Example::

        >>> y = np.array([0., 1., 0., 2., 0., 1., 0., 2.])[:, None]
        >>> perfect = np.stack([y[1:-1], y[2:]], axis=1)[:, :, :]          # origins 0..5
        >>> s = score_leads(np.concatenate([perfect, perfect[-1:]]), y, 2, window=4)
        >>> s.origins, s.nrmse
        ((2, 6), [0.0, 0.0])
    """
    y = np.asarray(series, np.float64).reshape(len(series), -1)
    p = np.asarray(preds, np.float64).reshape(len(preds), horizon, -1)
    if len(p) != len(y) - 1:
        raise ValueError(f"need a forecast per step but the last: {len(y) - 1}; got {len(p)}")
    stop = len(y) - horizon                  # the last origin whose H targets exist is stop - 1
    if stop < 2:
        raise ValueError(f"the series ({len(y)} values) is too short for a horizon of {horizon}")
    start = stop - _effective_window(window, stop)
    pers, seas = naive_leads(y, horizon, period)

    def per_lead(f):
        return [nrmse(f[start:stop, h - 1], y[start + h:stop + h]) for h in range(1, horizon + 1)]
    return LeadScores(horizon, (start, stop), per_lead(p), per_lead(pers),
                      per_lead(seas) if seas is not None else None, period)


def evaluate_leads(task: Task | str, config: dict | None = None, *, horizon: int, period: int = 0,
                   steps: int | None = None, window: int = 1000, seed: int = 0, progress=None) -> LeadScores:
    """Run a streamtrace config as a forecaster of the next ``horizon`` values of a forecast task
    (``learning.horizon`` set to it) and score it per lead (:func:`score_leads`).

    Example: ``evaluate_leads("mackey-glass", horizon=3, steps=200).nrmse`` has three entries."""
    from ..recipe.build import build_learner
    if isinstance(task, str):
        task = get_task(task, steps, seed)
    if task.mode != "forecast":
        raise ValueError(f"a horizon needs a forecast task; {task.name!r} is {task.mode}")
    data = config_data(task, config)
    data.setdefault("learning", {})["horizon"] = horizon
    if with_channels(task, data) is not task or task.n_in != task.n_out:
        raise ValueError("a horizon is scored on a forecast of every input channel (no learning.channels)")
    learner = build_learner(task_config(task, data, seed))
    preds = np.empty((len(task.inputs), horizon, task.n_out))
    for t, x in enumerate(task.inputs):
        preds[t] = np.reshape(learner.step(np.asarray(x, learner.x_dtype)).prediction, (horizon, task.n_out))
        if progress is not None:
            progress(t + 1, len(task.inputs))
    s = score_leads(preds, _series(task), horizon, window=window, period=period)
    s.task, s.label = task.name, "default" if config is None else "config"
    return s


def _series(task: Task) -> np.ndarray:
    """The forecast series y_0 .. y_T of a forecast task (inputs[0], then every target)."""
    return np.concatenate([task.inputs[:1], task.targets])


def format_leads(s: LeadScores) -> str:
    """One row per lead: the forecast's NRMSE, persistence's and the seasonal naive one's."""
    head = f"lead  nrmse      persistence  seasonal naive (period {s.period})" if s.seasonal else \
        "lead  nrmse      persistence"
    rows = [f"{h:<5d} {s.nrmse[h - 1]:<10.5g} {s.persistence[h - 1]:<12.5g}" +
            (f" {s.seasonal[h - 1]:.5g}" if s.seasonal else "") for h in range(1, s.horizon + 1)]
    return "\n".join([f"{s.task}: origins {s.origins[0]}..{s.origins[1] - 1}", head] + rows)


def run_cli(args) -> int:
    """``streamtrace evaluate --horizon H``: the per-lead table, then one JSON line."""
    from ..engine.config import ConfigError
    from .files import split_names
    from ..learner.dispatch import inline_dispatch
    from .tasks import TaskError
    inline_dispatch()
    try:
        task = get_task(args.task, args.steps, args.seed, columns=split_names(args.columns),
                        target=split_names(args.target), time_column=args.time_column)
        if task.note:
            print(f"evaluate: {task.note}", file=sys.stderr, flush=True)
        s = evaluate_leads(task, args.config, horizon=args.horizon, period=args.period, window=args.window,
                           seed=args.seed, progress=Progress(task.name))
    except (TaskError, ConfigError, ValueError) as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    print(format_leads(s))
    print(json.dumps({"task": s.task, "horizon": s.horizon, "nrmse": s.nrmse, "persistence": s.persistence,
                      "seasonal": s.seasonal, "period": s.period}), flush=True)
    return 0
