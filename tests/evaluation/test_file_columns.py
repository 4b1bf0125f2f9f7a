"""Which columns of a recorded file evaluate and replay use: time-like columns left out (and
said), --columns / --time-column / --target, and learning.channels (some columns forecast, the
rest exogenous inputs). The arrays are checked against the file's numbers sliced by hand."""
import json

import numpy as np
import pytest
from engine_helpers import fake_sensor_client

from streamtrace.evaluation import scoring as ev
from streamtrace.adapters.replay import ReplayError, read_table, select_rows
from streamtrace.commands.cli import main
from streamtrace.engine.config import ConfigError
from streamtrace.evaluation.files import FileError, choose_columns, is_time_like
from streamtrace.evaluation.tasks import TaskError, file_task, get_task

SMALL = {"model": {"stack": "rnn", "n_hidden": 8}, "learning": {"algorithm": "d-rtrl", "lr": 1e-2}}


def write(path, names, columns):
    rows = np.column_stack(columns)
    path.write_text(",".join(names) + "\n" + "".join(",".join(repr(float(v)) for v in r) + "\n" for r in rows))
    return rows


def signals(n=300, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return np.sin(0.1 * t) + 0.05 * rng.normal(size=n), np.cos(0.07 * t) + 0.05 * rng.normal(size=n)


# ---- detection --------------------------------------------------------------------------------
@pytest.mark.parametrize("values", [
    np.arange(50.0),                                   # a row counter
    1.7e9 + 0.004 * np.arange(50),                     # unix seconds at 250 Hz
    np.round(np.arange(50) / 300, 3),                  # 300 Hz written with 3 decimals: steps 0.003 / 0.004
])
def test_clocks_are_time_like(values):
    assert is_time_like(values)


@pytest.mark.parametrize("values", [
    0.01 * np.arange(300) + np.random.default_rng(1).normal(0, 0.05, 300),   # a data ramp with noise
    np.cumsum(np.random.default_rng(2).uniform(0.1, 2.0, 300)),              # increasing, uneven steps
    np.r_[np.arange(20.0), np.arange(20.0, 60.0, 2)],                          # the step doubles mid-way
    np.arange(9.0),                                                            # too few rows to tell
    np.r_[np.arange(30.0), np.nan, np.arange(31.0, 50)],                       # a gap
])
def test_data_is_not_time_like(values):
    assert not is_time_like(values)


def test_evaluate_leaves_a_time_column_out_and_says_so(tmp_path, capsys):
    a, b = signals()
    path = tmp_path / "rec.csv"
    rows = write(path, ["t", "a", "b"], [0.01 * np.arange(300), a, b])
    task = get_task(str(path))
    np.testing.assert_array_equal(task.inputs, rows[:-1, 1:])
    np.testing.assert_array_equal(task.targets, rows[1:, 1:])
    assert "'t' looks like time" in task.note
    assert main(["evaluate", str(path), "--config", str(_toml(tmp_path, SMALL)), "--window", "50"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "time" in line]
    assert len(err) == 1 and err[0].startswith("evaluate: column 't' looks like time")


def test_a_noisy_ramp_is_data(tmp_path):
    a, _ = signals()
    ramp = 0.01 * np.arange(300) + np.random.default_rng(3).normal(0, 0.05, 300)
    path = tmp_path / "ramp.csv"
    rows = write(path, ["ramp", "a"], [ramp, a])
    task = get_task(str(path))
    assert task.note == "" and task.n_in == 2
    np.testing.assert_array_equal(task.inputs, rows[:-1])


def test_a_lone_clock_like_column_is_kept(tmp_path):
    path = tmp_path / "one.csv"
    write(path, ["x"], [np.arange(20.0)])
    assert choose_columns(read_table(path)).inputs == ["x"]


# ---- naming columns ---------------------------------------------------------------------------
def test_columns_time_column_and_target_by_hand(tmp_path):
    a, b = signals()
    y = 0.5 * a + np.roll(b, 1)
    path = tmp_path / "sup.csv"
    rows = write(path, ["clock", "a", "b", "y"], [np.cumsum(np.full(300, 0.5)), a, b, y])
    task = get_task(str(path), steps=200, target=["y"], time_column="clock")
    assert task.mode == "supervised" and task.note == ""
    np.testing.assert_array_equal(task.inputs, rows[:200, 1:3])
    np.testing.assert_array_equal(task.targets, rows[:200, 3:])
    task = file_task(path, columns=["b", "0"], target=["3"])              # by name and position
    np.testing.assert_array_equal(task.inputs, rows[:, [2, 0]])
    cols = choose_columns(read_table(path), targets=["y"])
    assert cols.inputs == ["a", "b"] and cols.time_like == ["clock"]


@pytest.mark.parametrize("kwargs, words", [
    ({"columns": ["nope"]}, "--columns: no column 'nope'"),
    ({"target": ["9"]}, "--target: no column '9'"),
    ({"time_column": "when"}, "--time-column: no column 'when'"),
    ({"columns": ["a", "y"], "target": ["y"]}, "'y' is also the target"),
    ({"columns": ["a", "a"]}, "named twice"),
])
def test_bad_column_choices_are_named(tmp_path, kwargs, words):
    path = tmp_path / "f.csv"
    write(path, ["a", "y"], list(signals(20)))
    with pytest.raises(TaskError, match=words):
        file_task(path, **kwargs)


def test_file_columns_on_a_generated_task_are_refused(capsys):
    with pytest.raises(TaskError, match="columns choose a file's columns"):
        get_task("narma10", 50, columns=["a"])
    assert main(["evaluate", "narma10", "--target", "y"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_replay_chooses_the_same_columns(tmp_path, capsys):
    a, b = signals(40)
    path = tmp_path / "rec.csv"
    rows = write(path, ["t", "a", "b", "y"], [np.arange(40.0), a, b, a * b])
    got = select_rows(read_table(path), target_columns=["y"])
    assert got.inputs == ["a", "b"] and "'t' looks like time" in got.note
    np.testing.assert_array_equal(got.x, rows[:, 1:3])
    np.testing.assert_array_equal(got.y, rows[:, 3:])
    with pytest.raises(ReplayError, match="--target: no column 'z'"):
        select_rows(read_table(path), target_columns=["z"])
    with pytest.raises(FileError):
        choose_columns(read_table(path), columns=["q"])


# ---- learning.channels ------------------------------------------------------------------------
def _toml(tmp_path, data):
    from streamtrace.engine.launch import write_config
    return write_config(tmp_path / "c.toml", data)


@pytest.mark.parametrize("n_out", [None, 1])
def test_channels_forecast_one_column_the_other_exogenous(tmp_path, n_out):
    """[learning] channels = [1] on a two-column file: both columns are inputs, column 1 is the
    target one step ahead, and the predictions are those of the learner built from the same
    config and stepped by hand over the file's rows (as Forecast(channels=[1]) does)."""
    from streamtrace.recipe.build import build_learner
    from streamtrace.engine.config import load_config
    a, b = signals(120)
    path = tmp_path / "two.csv"
    rows = write(path, ["drive", "level"], [a, b])
    data = {"model": {**SMALL["model"], **({"n_out": n_out} if n_out else {})},
            "learning": {**SMALL["learning"], "channels": [1]}}
    r = ev.evaluate(str(path), _toml(tmp_path, data), window=30)
    np.testing.assert_array_equal(r.targets, rows[1:, 1:])
    assert r.predictions.shape == (119, 1)
    learner = build_learner(load_config(None, overrides={"model": {**SMALL["model"], "n_in": 2, "n_out": 1},
                                                         "learning": {**SMALL["learning"], "channels": [1],
                                                                      "mode": "forecast"}}))
    by_hand = [np.asarray(learner.step(np.asarray(x, learner.x_dtype)).prediction, np.float64).reshape(-1)
               for x in rows[:-1]]
    np.testing.assert_array_equal(r.predictions, np.array(by_hand))


def test_channels_out_of_range_is_one_clear_error(tmp_path):
    path = tmp_path / "two.csv"
    write(path, ["a", "b"], list(signals(30)))
    data = {"model": SMALL["model"], "learning": {**SMALL["learning"], "channels": [2]}}
    with pytest.raises(ConfigError, match=r"learning.channels = \[2\]: task 'two.csv' has input channels 0..1"):
        ev.evaluate(str(path), data, window=10)


def test_cli_target_column_supervised(tmp_path, capsys):
    a, b = signals(150)
    path = tmp_path / "s.csv"
    write(path, ["a", "b", "y"], [a, b, 0.5 * a - b])
    assert main(["evaluate", str(path), "--target", "y", "--config", str(_toml(tmp_path, SMALL)),
                 "--window", "40"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["steps"] == 150


def test_replay_scores_a_forecast_of_some_channels(tmp_path, monkeypatch):
    """With channels = [1] (the engine's learning.channels) the answer to row k predicts row
    k+1's column 1 only; persistence is row k's column 1. The engine is a fake whose answer is a
    known function of the row, so the NRMSE is computed by hand."""
    from streamtrace.adapters.replay import replay, write_predictions

    def answer(xs, ys, k):
        assert xs.shape == (2,) and ys is None                       # both columns go in
        return np.array([0.9 * xs[1] + 0.1 * xs[0]])

    a, b = signals(60)
    path = tmp_path / "two.csv"
    rows = write(path, ["drive", "level"], [a, b])
    monkeypatch.setattr("streamtrace.adapters.replay.SensorClient", fake_sensor_client(answer))
    r = replay(path, "ipc:///nowhere", channels=[1])
    pred, target, last = 0.9 * b[:-1] + 0.1 * a[:-1], b[1:], b[:-1]
    rmse = lambda p: np.sqrt(np.mean((p - target) ** 2)) / target.std()     # noqa: E731
    assert r.nrmse == pytest.approx(rmse(pred), rel=1e-12)
    assert r.persistence_nrmse == pytest.approx(rmse(last), rel=1e-12)
    write_predictions(r, tmp_path / "p.csv")
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == "row,pred_level"
    np.testing.assert_array_equal(rows[:, 1], b)
    with pytest.raises(ReplayError, match=r"--channels \[2\]: need distinct positions among the 2 inputs"):
        replay(path, "ipc:///nowhere", channels=[2])
    assert "give them with --channels" in replay(path, "ipc:///nowhere").note     # all inputs: not scored


def test_replay_takes_the_channels_of_the_served_config(tmp_path):
    from streamtrace.adapters.replay import _engine_config
    cfg = _toml(tmp_path, {"model": {"stack": "gru", "n_in": 2, "n_out": 1}, "learning": {"channels": [1]},
                           "sockets": {"router": "ipc:///tmp/x-router"}})
    assert _engine_config(str(cfg)) == ("ipc:///tmp/x-router", "forecast", [1])
