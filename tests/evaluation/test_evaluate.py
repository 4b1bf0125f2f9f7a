"""The prequential loop: scores computed by hand, persistence, and no look at a target before its
prediction is recorded (a peeking learner is caught)."""
from paths import ROOT
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from streamtrace.evaluation import scoring as ev
from streamtrace.engine.config import ConfigError
from streamtrace.evaluation.tasks import Task

SMALL = {"model": {"stack": "rnn", "n_hidden": 8}, "learning": {"algorithm": "d-rtrl", "lr": 1e-2}}


def test_nrmse_and_mae_by_hand():
    # targets 9, 1, 2, 3, 4; predictions always 0; window = last 4 steps -> targets 1..4
    targets = np.array([[9.0], [1.0], [2.0], [3.0], [4.0]])
    r = ev.prequential(lambda x, y: np.zeros(1), np.zeros((5, 1)), targets, window=4, mode="supervised")
    # RMSE = sqrt((1 + 4 + 9 + 16) / 4) = sqrt(7.5); std(1..4) = sqrt(1.25)  -> sqrt(6)
    assert r.window == 4 and r.steps == 5
    assert r.nrmse == pytest.approx(math.sqrt(6.0), rel=1e-12)
    assert r.mae == pytest.approx(2.5, rel=1e-12)
    # persistence predicts the last target: errors 8, 1, 1, 1 on the window -> sqrt(67/4) / sqrt(1.25)
    assert r.persistence_nrmse == pytest.approx(math.sqrt(67 / 4) / math.sqrt(1.25), rel=1e-12)


def test_nrmse_averages_channels():
    y = np.array([[0.0, 0.0], [2.0, 10.0], [0.0, 0.0], [2.0, 10.0]])      # stds 1 and 5
    p = y + np.array([1.0, 0.0])                                            # channel 0 off by 1
    assert ev.nrmse(p, y) == pytest.approx((1.0 / 1.0 + 0.0 / 5.0) / 2)


def test_persistence_of_a_known_forecast_series():
    series = np.arange(10.0) ** 2                 # x_{t+1} - x_t = 2t + 1
    task = Task.forecast("squares", series)
    np.testing.assert_array_equal(ev.persistence(task)[:, 0], series[:-1])
    r = ev.prequential(lambda x, y: x, series, window=4)        # a persistence learner on the series
    err = 2 * np.arange(5, 9) + 1                 # the last 4 targets are x_6..x_9, errors 11, 13, 15, 17
    want = math.sqrt(np.mean(err ** 2)) / np.std(series[6:10])
    assert r.nrmse == pytest.approx(want, rel=1e-12)
    assert r.persistence_nrmse == pytest.approx(want, rel=1e-12)


def test_window_clamped_on_short_series_and_refused_when_empty():
    r = ev.prequential(lambda x, y: x, np.arange(20.0)[:, None], np.arange(1.0, 21.0)[:, None], window=1000)
    assert r.window == 10
    with pytest.raises(ValueError, match="window"):
        ev.prequential(lambda x, y: x, np.zeros((4, 1)), np.ones((4, 1)), window=0)


def _perturbed(task: Task, k: int, delta: float = 5.0) -> Task:
    """The same stream with target k (and, for forecasts, the input that carries it) changed."""
    inputs, targets = task.inputs.copy(), task.targets.copy()
    targets[k] += delta
    if task.mode == "forecast":
        inputs[k + 1] += delta
    return Task(task.name, task.mode, inputs, targets)


def _first_difference(run, task, k):
    a, b = run(task).predictions, run(_perturbed(task, k)).predictions
    diff = np.where(np.any(a != b, axis=tuple(range(1, a.ndim))))[0]
    return int(diff[0]) if len(diff) else None


def test_a_peeking_learner_is_caught():
    task = Task.forecast("sine", np.sin(0.3 * np.arange(60.0)))
    honest = lambda t: ev.prequential(lambda x, y: 0.9 * x, t.inputs, t.targets)      # noqa: E731
    peeking = lambda t: ev.prequential(lambda x, y: y, t.inputs, t.targets)          # noqa: E731
    # changing target 30 may only change predictions made after it was revealed (step 31 on)
    assert _first_difference(honest, task, 30) == 31
    assert _first_difference(peeking, task, 30) == 30                                  # caught


@pytest.mark.parametrize("name", ["forecast", "supervised"])
def test_streamtrace_learner_never_sees_a_target_before_predicting_it(name):
    rng = np.random.default_rng(0)
    if name == "forecast":
        task = Task.forecast("sine", np.sin(0.2 * np.arange(80.0)) + 0.1 * rng.normal(size=80))
    else:
        task = Task("pairs", "supervised", rng.normal(size=(80, 1)), rng.normal(size=(80, 1)))
    run = lambda t: ev.evaluate(t, SMALL, window=20)                                    # noqa: E731
    # the prediction of target 50 is unchanged by target 50; the learner learns from it after
    assert _first_difference(run, task, 50) == 51


def test_task_config_fills_from_the_task_and_refuses_misfits(tmp_path):
    lorenz = Task.forecast("lorenz", np.random.default_rng(0).normal(size=(10, 3)))
    cfg = ev.task_config(lorenz, None)
    assert (cfg.model.n_in, cfg.model.n_out, cfg.learning.mode) == (3, 3, "forecast")
    assert cfg.model.stack == ev.default_config(lorenz)["model"]["stack"]
    narma = Task("narma10", "supervised", np.zeros((10, 1)), np.zeros((10, 1)))
    assert ev.task_config(narma, SMALL, seed=4).learning.mode == "supervised"
    assert ev.task_config(narma, SMALL, seed=4).model.seed == 4
    toml = tmp_path / "c.toml"
    toml.write_text('[model]\nstack = "gru"\nn_in = 2\n')
    with pytest.raises(ConfigError, match="model.n_in = 2 does not fit task 'lorenz'"):
        ev.task_config(lorenz, toml)
    toml.write_text('[learning]\nlr = "fast"\n')
    with pytest.raises(ConfigError, match="learning.lr"):
        ev.task_config(lorenz, toml)


def test_cli_end_to_end(tmp_path):
    png = tmp_path / "mg.png"
    out = subprocess.run([sys.executable, "-m", "streamtrace", "evaluate", "mackey-glass", "--steps", "300",
                          "--plot", str(png)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["task", "config", "steps"]
    result = json.loads(lines[-1])
    assert set(result) == {"task", "nrmse", "mae", "us_per_step", "steps"}
    assert result["task"] == "mackey-glass" and result["steps"] == 300
    assert 0 < result["nrmse"] < 2 and result["us_per_step"] > 0
    assert png.stat().st_size > 1000 and "step 300/300" in out.stderr


def test_cli_file_with_config_and_errors(tmp_path, capsys):
    from streamtrace.commands.cli import main
    t = np.arange(200)
    np.savetxt(tmp_path / "s.csv", np.column_stack([np.sin(0.1 * t), np.cos(0.1 * t)]), delimiter=",",
               header="a,b", comments="")
    (tmp_path / "c.toml").write_text('[model]\nstack = "rnn"\nn_hidden = 8\n[learning]\nlr = 0.01\n')
    assert main(["evaluate", str(tmp_path / "s.csv"), "--config", str(tmp_path / "c.toml"), "--window", "50"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["task"] == "s.csv" and result["steps"] == 199 and math.isfinite(result["nrmse"])
    assert main(["evaluate", "nope"]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("peer", ["reservoirpy", "river-snarimax", "river-lagged", "jax"])
def test_benchmark_peers_predict_before_learning(peer):
    """The quality benchmark's wrappers score the prediction made before the learner sees the
    target (reservoirpy's RLS.partial_fit returns the one after)."""
    from pathlib import Path
    sys.path.insert(0, str(ROOT / "bench"))
    import quality_peers as qp
    if peer == "reservoirpy":
        pytest.importorskip("reservoirpy")
        make = lambda: qp.reservoirpy_esn(units=30, seed=0)                          # noqa: E731
    elif peer.startswith("river"):
        pytest.importorskip("river")
        make = (lambda: qp.river_snarimax(p=3)) if peer == "river-snarimax" else \
            (lambda: qp.river_lagged(lags=4, kind="bayes"))
    else:
        make = lambda: qp.jax_esn_rls(units=30, delta=1e-2)                          # noqa: E731
    task = Task.forecast("sine", np.sin(0.3 * np.arange(60.0)))
    run = lambda t: ev.prequential(make(), t.inputs, t.targets)                      # noqa: E731
    assert _first_difference(run, task, 30) == 31


def _slice_nrmse(p, y):
    return float(np.mean(np.sqrt(np.mean((p - y) ** 2, 0)) / y.std(0)))


def test_score_span_and_named_spans_against_numpy():
    rng = np.random.default_rng(3)
    inputs, targets = rng.normal(size=(120, 2)), rng.normal(size=(120, 2))
    state = {"t": 0}

    def step(x, y):                   # a made-up learner whose predictions drift with time
        state["t"] += 1
        return 0.5 * x + 0.01 * state["t"]
    r = ev.prequential(step, inputs, targets, mode="supervised", window=7, score=(30, 70),
                       spans={"early": (0, 20), "late": (100, 120)})
    preds = 0.5 * inputs + 0.01 * np.arange(1, 121)[:, None]
    naive = np.vstack([np.zeros((1, 2)), targets[:-1]])        # persistence: the last target seen
    np.testing.assert_allclose(r.predictions, preds)
    assert r.score == (30, 70) and r.window == 40 and r.steps == 120
    assert r.nrmse == pytest.approx(_slice_nrmse(preds[30:70], targets[30:70]), rel=1e-12)
    assert r.mae == pytest.approx(np.abs(preds[30:70] - targets[30:70]).mean(), rel=1e-12)
    assert r.persistence_nrmse == pytest.approx(_slice_nrmse(naive[30:70], targets[30:70]), rel=1e-12)
    for k, (a, b) in (("early", (0, 20)), ("late", (100, 120))):
        assert r.spans[k] == pytest.approx(_slice_nrmse(preds[a:b], targets[a:b]), rel=1e-12)
        assert r.persistence_spans[k] == pytest.approx(_slice_nrmse(naive[a:b], targets[a:b]), rel=1e-12)
    plain = ev.prequential(lambda x, y: 0.5 * x, inputs, targets, mode="supervised", window=7)
    assert plain.score == (113, 120) and plain.spans == {}                 # no span: the last window, as before
    summary = json.loads(ev.summary_json(r))
    assert summary["spans"] == pytest.approx(r.spans) and "spans" not in json.loads(ev.summary_json(plain))
    assert "late: nrmse" in ev.format_table([r])


def test_bad_spans_are_refused_by_name():
    x = np.zeros((50, 1))
    y = np.arange(50.0)[:, None]
    with pytest.raises(ValueError, match="span 'late' = \\(40, 60\\) is not within the 50 steps"):
        ev.prequential(lambda a, b: a, x, y, mode="supervised", spans={"late": (40, 60)})
    with pytest.raises(ValueError, match="span 'score'"):
        ev.prequential(lambda a, b: a, x, y, mode="supervised", score=(10, 10))
    with pytest.raises(ValueError, match="must be \\(start, stop\\)"):
        ev.prequential(lambda a, b: a, x, y, mode="supervised", spans={"x": 5})


def test_evaluate_scores_the_tasks_own_spans(monkeypatch):
    # the learner replaced by a fixed rule: this checks evaluate's wiring of Task.score / Task.spans
    import streamtrace.recipe.build as build
    monkeypatch.setattr(build, "build_learner", lambda cfg: None)
    monkeypatch.setattr(ev, "learner_step_fn", lambda learner, mode: lambda x, y: 0.8 * x)
    series = np.sin(0.05 * np.arange(301.0)) + 0.01 * np.arange(301.0)
    base = Task.forecast("s", series)
    task = Task("s", "forecast", base.inputs, base.targets, score=(100, 150), spans={"tail": (250, 300)})
    r = ev.evaluate(task, SMALL, window=10)
    p, y = 0.8 * task.inputs, task.targets
    assert r.score == (100, 150) and r.window == 50
    assert r.nrmse == pytest.approx(_slice_nrmse(p[100:150], y[100:150]), rel=1e-12)
    assert r.persistence_nrmse == pytest.approx(_slice_nrmse(task.inputs[100:150], y[100:150]), rel=1e-12)
    assert r.spans == {"tail": pytest.approx(_slice_nrmse(p[250:300], y[250:300]), rel=1e-12)}


def test_cli_steps_default_per_task_and_span_errors(monkeypatch, capsys):
    from streamtrace.commands.cli import main
    seen = {}

    def fake_evaluate(task, config, **kw):          # no learner: only which task the CLI built
        seen[task.name] = task.steps
        return ev.Result(task.name, task.steps, 1000, 0.5, 0.1, 1.0, 1.0)
    monkeypatch.setattr(ev, "evaluate", fake_evaluate)
    assert main(["evaluate", "delay-recall:20"]) == 0 and main(["evaluate", "mackey-glass"]) == 0
    assert seen == {"delay-recall:20": 25000, "mackey-glass": 6000}
    assert main(["evaluate", "regime-switch", "--steps", "3000"]) == 2
    assert "needs steps >= 4500" in capsys.readouterr().err


def test_screened_rows_are_left_out_of_the_score_by_hand():
    """A step the learner screened: the row whose target is the glitch, and persistence's next
    row, are not scored; the score is the hand-computed one over the rest."""
    series = np.array([1.0, 2.0, 4.0, 1e40, 3.0, 5.0, 4.0, 6.0, 5.0])
    inputs, targets = series[:-1, None], series[1:, None]
    preds = np.array([1.5, 3.0, 3.5, 3.2, 4.0, 4.5, 5.5, 5.0])

    def step(x, y, state={"t": 0}):
        t = state["t"]
        state["t"] += 1
        return preds[t], bool(x[0] == 1e40)          # step 3 sees the glitch as its input
    r = ev.prequential(step, inputs, targets, score=(0, 8), mode="forecast")
    keep = [0, 1, 4, 5, 6, 7]                        # row 2's target is the glitch; row 3 is persistence from it
    p, y = preds[keep], targets[keep, 0]
    assert r.screened == 1
    assert r.nrmse == pytest.approx(np.sqrt(np.mean((p - y) ** 2)) / y.std())
    assert r.mae == pytest.approx(np.mean(np.abs(p - y)))
    naive = np.r_[inputs[0, 0], targets[:-1, 0]][keep]
    assert r.persistence_nrmse == pytest.approx(np.sqrt(np.mean((naive - y) ** 2)) / y.std())


def test_evaluate_of_a_recording_with_a_glitch_scores_as_the_clean_one():
    """The default learner on a Mackey-Glass recording with one 1e40 glitch in its scored rows:
    the glitch is screened, counted and not scored, so the score matches the clean recording's."""
    clean = ev.get_task("mackey-glass", 1500)
    x = clean.inputs.copy()
    x[1300] = 1e40
    glitched = Task("mg-glitch", "forecast", x, np.r_[x[1:], clean.targets[-1:]])
    a = ev.evaluate(clean, window=500)
    b = ev.evaluate(glitched, window=500)
    assert b.screened >= 1 and a.screened == 0
    assert math.isfinite(b.nrmse) and b.nrmse <= 1.1 * a.nrmse
