"""Forecasts H steps ahead scored per lead (streamtrace/evaluation/leads.py, ``evaluate --horizon``): the
scores and the simple forecasts against a hand-computed example, and the command end to end."""
import json

import numpy as np
import pytest

from streamtrace.commands.cli import main
from streamtrace.evaluation.leads import naive_leads, score_leads


def test_naive_forecasts_by_hand():
    y = np.array([10., 11., 12., 13., 14.])[:, None]
    pers, seas = naive_leads(y, 3, period=2)
    assert pers[3, :, 0].tolist() == [13., 13., 13.]
    # from y_3, period 2: lead 1 -> y_2 (one season back from y_4), lead 2 -> y_3, lead 3 -> y_2
    assert seas[3, :, 0].tolist() == [12., 13., 12.]
    # from y_0 lead 1 would reach y_-1: persistence's forecast instead
    assert seas[0, :, 0].tolist() == [10., 10., 10.]
    assert naive_leads(y, 2)[1] is None


def test_scores_per_lead_by_hand():
    """y = 0..5, H = 2: origins 0..3 have both targets; a long window scores the second half of
    them, origins 2 and 3. Lead 1's targets are y_3, y_4 = 3, 4 (std 0.5), lead 2's y_4, y_5 = 4, 5.
      forecast   lead 1: 3.5, 4 -> errors 0.5, 0 -> RMSE sqrt(0.125) -> NRMSE 0.70711
                 lead 2: 4, 4   -> errors 0, 1  -> RMSE sqrt(0.5)   -> NRMSE 1.41421
      persistence (y_2, y_3 = 2, 3): errors 1, 1 and 2, 2 -> NRMSE 2 and 4
      seasonal naive, period 2: lead 1 from y_{t-1} (1, 2): errors 2, 2 -> 4; lead 2 from y_t -> 4"""
    y = np.arange(6.0)[:, None]
    preds = np.full((5, 2, 1), np.nan)
    preds[2, :, 0] = [3.5, 4.0]
    preds[3, :, 0] = [4.0, 4.0]
    s = score_leads(preds, y, 2, window=1000, period=2)
    assert s.origins == (2, 4)
    np.testing.assert_allclose(s.nrmse, [np.sqrt(0.125) / 0.5, np.sqrt(0.5) / 0.5], rtol=1e-12)
    np.testing.assert_allclose(s.persistence, [2.0, 4.0], rtol=1e-12)
    np.testing.assert_allclose(s.seasonal, [4.0, 4.0], rtol=1e-12)


def test_refuses_a_forecast_count_that_does_not_fit():
    with pytest.raises(ValueError, match="a forecast per step"):
        score_leads(np.zeros((3, 2, 1)), np.zeros((6, 1)), 2)
    with pytest.raises(ValueError, match="too short"):
        score_leads(np.zeros((2, 2, 1)), np.zeros((3, 1)), 2)


def test_evaluate_horizon_command(capsys):
    """The default learner forecasting Mackey-Glass 4 steps ahead beats persistence at every lead."""
    assert main(["evaluate", "mackey-glass", "--steps", "600", "--horizon", "4", "--period", "50"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["horizon"] == 4 and len(out["nrmse"]) == len(out["persistence"]) == len(out["seasonal"]) == 4
    assert all(m < p for m, p in zip(out["nrmse"], out["persistence"]))


def test_a_horizon_on_a_supervised_task_is_refused(capsys):
    assert main(["evaluate", "narma10", "--steps", "100", "--horizon", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "forecast task" in err[0]


def test_replay_scores_each_lead_against_the_row_it_forecasts(tmp_path, monkeypatch):
    """A fake engine forecasting x + 1, x + 2 from row x of x = 0..29 is exact at both leads only
    if lead h of answer j is scored against the row h answers later. With window 0 (all) the
    origins are the second half of those with both targets: 14..27; each lead's 14 targets are
    consecutive integers, std sqrt((14^2 - 1) / 12), and persistence errs by h."""
    from engine_helpers import fake_sensor_client
    from streamtrace.adapters.replay import replay
    path = tmp_path / "ramp.csv"
    path.write_text("x\n" + "".join(f"{i}\n" for i in range(30)))
    monkeypatch.setattr("streamtrace.adapters.replay.SensorClient",
                        fake_sensor_client(lambda xs, ys, k: np.array([xs[0] + 1.0, xs[0] + 2.0])))
    r = replay(path, "ipc:///nowhere", columns=["x"], window=0, horizon=2)
    std = np.sqrt((14 ** 2 - 1) / 12)
    assert r.leads.origins == (14, 28)
    np.testing.assert_allclose(r.leads.nrmse, [0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(r.leads.persistence, [1 / std, 2 / std], rtol=1e-12)
    s = r.summary()
    assert s["leads"]["nrmse"] == r.leads.nrmse
    # the one-line JSON's own scores are lead 1's, over the 14 origins scored
    assert s["scored"] == 14 and s["nrmse"] == r.leads.nrmse[0]
    assert s["persistence_nrmse"] == pytest.approx(1 / std, rel=1e-12)
    # an engine whose horizon is not the one given: said, not scored
    r = replay(path, "ipc:///nowhere", columns=["x"], window=0, horizon=3)
    assert r.leads is None and "not --horizon 3" in r.note
