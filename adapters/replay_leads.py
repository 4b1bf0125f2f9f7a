"""``replay --horizon H``: an engine forecasting H steps ahead (``[learning] horizon = H``) scored
per lead, as ``evaluate --horizon`` scores a learner (streamtrace/evaluation/leads.py).

Answer j, made after the j-th answered row, holds the forecasts of the next H answered rows'
inputs (or the engine's ``--channels``); lead h of it is scored against the row h answers later,
beside persistence and, with a period, the seasonal naive forecast at that lead.
"""
from __future__ import annotations

import numpy as np

from streamtrace.evaluation.leads import score_leads

__all__ = ["score_replay_leads"]


def score_replay_leads(result, rows, horizon: int, window: int, period: int = 0) -> None:
    """Set ``result.leads`` (a ``LeadScores``) from a forecast replay's answers, or ``result.note``
    saying why not.

    ``result``: a ``ReplayResult`` (its mode, channels, rows_answered, predictions (answered,
    H * C), flagged, file); ``rows``: the file's rows (``rows.x``); ``window``: origins scored
    (0: all); ``period``: the seasonal naive forecast's (0: none). The last answer's forecasts
    have no target and are left out.

    Example::

        >>> from types import SimpleNamespace as NS
        >>> x = np.arange(12.0)[:, None]
        >>> r = NS(mode="forecast", channels=None, rows_answered=np.arange(12), file="f.csv",
        ...        predictions=np.hstack([x + 1, x + 2]), flagged=None, note="", leads=None)
        >>> score_replay_leads(r, NS(x=x), 2, 0)
        >>> r.leads.nrmse
        [0.0, 0.0]
    """
    if result.mode != "forecast":
        result.note = "--horizon scores a forecast: the engine runs in supervised mode"
        return
    cols = result.channels or slice(None)
    series = rows.x[result.rows_answered][:, cols]
    p = result.predictions
    if len(series) < horizon + 3:
        result.note = f"{len(series)} answered rows: too few to score {horizon} leads"
        return
    if p.shape[1] != horizon * series.shape[1]:
        result.note = (f"the engine predicts {p.shape[1]} values per step, not --horizon {horizon} x "
                       f"{series.shape[1]} channel(s): not scored (is its learning.horizon {horizon}?)")
        return
    try:
        result.leads = score_leads(p[:-1].reshape(len(p) - 1, horizon, series.shape[1]), series, horizon,
                                   window=window if window > 0 else len(series), period=period)
    except ValueError as e:            # a constant target at some lead
        result.note = str(e)
        return
    result.leads.task = result.file
    if result.flagged is not None and result.flagged.any():
        result.note = "rows the engine screened as outliers are scored per lead as sent"
