"""`streamtrace replay FILE` (streamtrace.adapters.replay).

The oracles: an engine fed the same rows by hand through SensorClient (exact predictions),
numpy re-implementations of NRMSE / MAE / persistence, the file's rows parsed by numpy, and
the wall clock as a lower bound for paced replays. The engines are real subprocesses on ipc.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import fake_sensor_client

from streamtrace.transport import SensorClient
from streamtrace.adapters.replay import ReplayError, read_table, replay, select_rows
from streamtrace.commands.cli import main
from streamtrace.engine.launch import start_engine, stop, write_config
from streamtrace.evaluation.tasks import TaskError, load_file

ROWS, BAD_ROW = 200, 57            # BAD_ROW: data row with a text cell in column a
GRU = {
    "model": {"stack": "gru", "n_in": 2, "n_hidden": 8, "n_out": 2},
    "learning": {"algorithm": "d-rtrl", "mode": "forecast", "optimizer": "adam", "lr": 5e-3},
    "engine": {"slots": 4, "micro_batch": 1, "park_s": 0.0},   # fewer variants to compile at start
    "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False},
    "checkpoint": {"dir": ""},
}


def write_csv(path: Path, rows: int = ROWS, bad: int | None = BAD_ROW) -> np.ndarray:
    """Columns t (seconds), a, b, label (text); returns the (rows, 2) values of a, b."""
    t = np.arange(rows)
    ab = np.column_stack([np.sin(0.1 * t), 0.5 * np.cos(0.07 * t) + 0.1])
    lines = ["t,a,b,label"]
    for i in range(rows):
        a = "oops" if i == bad else f"{ab[i, 0]:.6f}"
        lines.append(f"{0.01 * i:.2f},{a},{ab[i, 1]:.6f},x{i}")
    path.write_text("\n".join(lines) + "\n")
    return ab


def np_nrmse(pred, target):
    return float(np.mean(np.sqrt(np.mean((pred - target) ** 2, 0)) / target.std(0)))


@pytest.fixture(scope="module")
def hand_engine(tmp_path_factory):
    """A fresh engine of the same config for the hand-fed oracle. It starts in the background,
    so that its start overlaps the start of the engine the CLI test launches itself."""
    sock = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    ep = {"router": f"ipc://{sock}/router"}
    cfg = write_config(tmp_path_factory.mktemp("replay-hand") / "hand.toml",
                       {**GRU, "sockets": {"router": ep["router"], "pull": "", "pub": ""}})
    box = {}
    starter = threading.Thread(target=lambda: box.update(proc=start_engine(cfg)), daemon=True)
    starter.start()

    def ready():
        starter.join(180)
        assert "proc" in box, "the hand-fed engine did not start"
        return ep
    try:
        yield ready
    finally:
        starter.join(180)
        if "proc" in box:
            stop(box["proc"])
            box["proc"].stdout.close()
        shutil.rmtree(sock, ignore_errors=True)
    assert box["proc"].returncode == 0, f"engine exited with {box['proc'].returncode}"


def test_cli_replay_equals_hand_fed_engine_and_reports_the_bad_row(tmp_path, capsys, hand_engine):
    csv_path = tmp_path / "sensors.csv"
    write_csv(csv_path)
    sock = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    try:
        cfg = write_config(tmp_path / "engine.toml", {**GRU, "sockets": {
            "router": f"ipc://{sock}/router", "pull": "", "pub": ""}})
        out, png = tmp_path / "pred.csv", tmp_path / "replay.png"
        rc = main(["replay", str(csv_path), "--serve", str(cfg), "--columns", "a,b", "--time-column", "t",
                   "--out", str(out), "--plot", str(png)])
    finally:
        shutil.rmtree(sock, ignore_errors=True)
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    summary = json.loads(stdout.strip().splitlines()[-1])
    # the bad row is reported with its line (header = line 1) and skipped; every other row answered
    assert f"line {BAD_ROW + 2}: column 'a'" in stdout
    assert (summary["rows"], summary["sent"], summary["steps"], summary["bad_rows"], summary["refused"]) == \
        (ROWS, ROWS - 1, ROWS - 1, 1, {})
    got = np.loadtxt(out, delimiter=",", skiprows=1)
    good = [i for i in range(ROWS) if i != BAD_ROW]
    assert got[:, 0].astype(int).tolist() == good

    # the oracle: the same rows, parsed by numpy, sent by hand to a fresh engine of the same config
    raw = np.genfromtxt(csv_path, delimiter=",", skip_header=1, usecols=(1, 2))
    rows = raw[np.isfinite(raw).all(1)]
    assert len(rows) == ROWS - 1
    with SensorClient(hand_engine()["router"], stream="by-hand", timeout_s=60) as c:
        hand = np.array([c.step(r).pred for r in rows], np.float64)
    np.testing.assert_array_equal(got[:, 1:], hand)

    # prequential metrics: the answer to row k predicts the next sent row
    pred, target, last = hand[:-1], rows[1:], rows[:-1]
    assert summary["scored"] == ROWS - 2
    assert summary["nrmse"] == pytest.approx(np_nrmse(pred, target), rel=1e-9)
    assert summary["mae"] == pytest.approx(float(np.abs(pred - target).mean()), rel=1e-9)
    assert summary["persistence_nrmse"] == pytest.approx(np_nrmse(last, target), rel=1e-9)
    assert png.stat().st_size > 1000


def test_rate_paces_the_replay(tmp_path, hand_engine):
    n, rate = 30, 40.0
    ab = write_csv(tmp_path / "paced.csv", rows=n, bad=None)
    t0 = time.perf_counter()
    r = replay(tmp_path / "paced.csv", hand_engine()["router"], stream="paced", columns=["a", "b"], rate=rate)
    elapsed = time.perf_counter() - t0
    assert r.answered == n and not r.refused and not r.bad_rows
    assert elapsed >= 0.95 * (n - 1) / rate          # a lower bound only: a busy machine is slower
    np.testing.assert_allclose(r.scored_targets, ab[1:], atol=1e-6)   # scored against the next row


def test_engine_refusals_are_counted_and_the_replay_goes_on(tmp_path, hand_engine):
    """A value beyond float32 passes the file check but the engine refuses it (not_finite)."""
    path = tmp_path / "huge.csv"
    path.write_text("a,b\n" + "".join(f"{0.1 * i},{'1e300' if i == 5 else 0.2 * i}\n" for i in range(12)))
    # a is an exact ramp (time-like): named, so that it is sent as data
    r = replay(path, hand_engine()["router"], stream="huge", columns=["a", "b"])
    assert dict(r.refused) == {"not_finite": 1} and r.answered == 11 and r.sent == 12
    assert 5 not in r.rows_answered.tolist()


def test_supervised_scoring_pairs_each_answer_with_its_own_row(tmp_path, monkeypatch):
    """Supervised: the answer to row k is scored against row k's targets, persistence against
    row k-1's. The engine's answers are replaced by a known function of the row to check that."""
    path = tmp_path / "sup.csv"
    x = np.sin(0.3 * np.arange(20))
    y = np.cos(0.2 * np.arange(20))
    path.write_text("x,y\n" + "".join(f"{float(a)!r},{float(b)!r}\n" for a, b in zip(x, y)))

    def answer(xs, ys, k):
        assert ys is not None and ys.shape == (1,)
        return np.array([2.0 * xs[0]])

    monkeypatch.setattr("streamtrace.adapters.replay.SensorClient", fake_sensor_client(answer))
    r = replay(path, "ipc:///nowhere", columns=["x"], target_columns=["y"])
    assert r.mode == "supervised"
    pred, target = 2 * x[1:, None], y[1:, None]
    assert r.nrmse == pytest.approx(np_nrmse(pred, target), rel=1e-12)
    assert r.persistence_nrmse == pytest.approx(np_nrmse(y[:-1, None], target), rel=1e-12)


def test_the_default_window_scores_as_evaluate_does_and_the_whole_run_is_shown_too(tmp_path, monkeypatch):
    """By default the last 1,000 steps are scored (as ``streamtrace evaluate`` scores), so the two
    commands agree on the same learner; the whole run's NRMSE, learning from scratch included,
    is reported beside it. Answers are a known function of the row (a fake engine)."""
    from streamtrace.adapters.replay import _report
    n = 1500
    x = np.sin(0.05 * np.arange(n)) + 0.001 * np.arange(n)
    path = tmp_path / "long.csv"
    path.write_text("x\n" + "".join(f"{float(a)!r}\n" for a in x))

    def answer(xs, ys, k):                 # a forecast that starts poor and gets better
        return np.array([xs[0] + (1.0 if k < 500 else 0.01)])

    monkeypatch.setattr("streamtrace.adapters.replay.SensorClient", fake_sensor_client(answer))
    r = replay(path, "ipc:///nowhere", columns=["x"])
    pred = x[:-1, None] + np.where(np.arange(1, n) < 500, 1.0, 0.01)[:, None]
    target = x[1:, None]
    assert len(r.scored_targets) == 1000
    assert r.nrmse == pytest.approx(np_nrmse(pred[-1000:], target[-1000:]), rel=1e-12)
    assert r.nrmse_all == pytest.approx(np_nrmse(pred, target), rel=1e-12)
    assert r.nrmse_all > 10 * r.nrmse
    text = _report(r)
    assert "the last 1000 of 1499 steps" in text and f"all 1499 steps: NRMSE {r.nrmse_all:.5g}" in text
    assert replay(path, "ipc:///nowhere", columns=["x"], window=0).nrmse == pytest.approx(r.nrmse_all, rel=1e-12)


# ---- reading and choosing rows (no engine) -----------------------------------------------------------
def test_default_columns_skip_text_time_and_targets(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text("when,a,b,label,y\n2024-01-01T00:00:00,1,2,u,3\n2024-01-01T00:00:01.5,4,,v,6\n"
                    "2024-01-01T00:00:02,7,8,w,9\n")
    rows = select_rows(read_table(path), target_columns=["y"], time_column="when")
    assert rows.inputs == ["a", "b"] and rows.targets == ["y"]
    np.testing.assert_allclose(np.diff(rows.ts), [1.5, 0.5])
    assert list(rows.bad) == [1] and "column 'b'" in rows.bad[1]       # the empty cell
    np.testing.assert_array_equal(rows.x[[0, 2]], [[1, 2], [7, 8]])


def test_headerless_csv_and_npy_columns_by_position(tmp_path):
    (tmp_path / "h.csv").write_text("1,2\n3,4\n5,nan\n")
    rows = select_rows(read_table(tmp_path / "h.csv"), columns=["1"])
    assert rows.inputs == ["1"] and list(rows.bad) == [2]
    np.save(tmp_path / "a.npy", np.arange(6.0).reshape(3, 2))
    rows = select_rows(read_table(tmp_path / "a.npy"), columns=["1"])
    np.testing.assert_array_equal(rows.x[:, 0], [1, 3, 5])


@pytest.mark.parametrize("kwargs, words", [
    ({"columns": ["nope"]}, "no column 'nope'"),
    ({"rate": 10.0, "realtime": True}, "one of --rate and --realtime"),
    ({"realtime": True}, "--time-column"),
    ({"rate": -1.0}, "--rate must be a positive"),
])
def test_bad_choices_name_what_is_wrong(tmp_path, kwargs, words):
    write_csv(tmp_path / "f.csv", rows=5)
    with pytest.raises(ReplayError, match=words):
        replay(tmp_path / "f.csv", "ipc:///nowhere", **kwargs)


def test_no_engine_is_a_clear_error(tmp_path, capsys):
    write_csv(tmp_path / "f.csv", rows=5)
    rc = main(["replay", str(tmp_path / "f.csv"), "--endpoint", f"ipc://{tmp_path}/none", "--timeout", "0.3"])
    err = capsys.readouterr().err
    assert rc == 2 and "no answer from an engine" in err


def test_parquet_without_pyarrow_says_what_to_install(tmp_path):
    try:
        import pyarrow  # noqa: F401
        pytest.skip("pyarrow is installed: the missing-dependency message cannot be shown")
    except ImportError:
        pass
    (tmp_path / "f.parquet").write_bytes(b"PAR1")
    with pytest.raises(ReplayError, match="pip install pyarrow"):
        read_table(tmp_path / "f.parquet")
    with pytest.raises(TaskError, match="pip install pyarrow"):     # `streamtrace evaluate f.parquet` too
        load_file(tmp_path / "f.parquet")


# ---- units: the file's rate and input units against the [stream] of --serve's config --------------
def test_file_units_convert_the_inputs_and_check_the_time_columns_rate(tmp_path):
    from streamtrace.adapters.replay import FileUnits
    from streamtrace.engine.config import StreamConfig
    write_csv(tmp_path / "f.csv", rows=20, bad=None)          # t steps 0.01 s: 100 Hz
    rows = select_rows(read_table(tmp_path / "f.csv"), ["a", "b"], None, "t")
    x = FileUnits(["mV", "uV"], StreamConfig(rate=100.0, units=["V", "mV"])).apply(rows)
    np.testing.assert_allclose(x, rows.x * [1e-3, 1e-3], rtol=1e-15)     # by hand: mV -> V, uV -> mV
    with pytest.raises(ReplayError, match=r"the file: samples at 100 Hz; the config's stream.rate is 250 Hz"):
        FileUnits([], StreamConfig(rate=250.0)).apply(rows)
    with pytest.raises(ReplayError, match=r"--units names 1 units for 2 input columns"):
        FileUnits(["mV"], StreamConfig(units=["V", "V"])).apply(rows)
    with pytest.raises(ReplayError, match=r"channel 1: 's' is a duration, 'mV' is a voltage"):
        FileUnits(["V", "s"], StreamConfig(units=["V", "mV"])).apply(rows)


@pytest.mark.parametrize("extra,words", [
    (["--units", "mV,mV"], "--units converts the file into the [stream] units of an engine's config: give --serve"),
    (["--serve", "{cfg}", "--time-column", "t"], "the file: samples at 100 Hz; the config's stream.rate is 250 Hz"),
])
def test_the_cli_refuses_units_and_rates_that_do_not_fit_before_an_engine_starts(tmp_path, capsys, extra, words):
    write_csv(tmp_path / "f.csv", rows=20, bad=None)
    cfg = write_config(tmp_path / "c.toml", {"stream": {"rate": "250 Hz"}})
    rc = main(["replay", str(tmp_path / "f.csv"), "--endpoint", f"ipc://{tmp_path}/none", "--timeout", "0.3",
               "--columns", "a,b"] + [e.format(cfg=cfg) for e in extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "replay: " + words + err.strip().partition(words)[2], err


def test_a_rate_may_be_a_frequency(capsys):
    from streamtrace.arguments import frequency
    assert (frequency("2 kHz"), frequency("40"), frequency("0.5 Hz")) == (2000.0, 40.0, 0.5)
    assert main(["replay", "f.csv", "--rate", "2 s"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--rate" in err[0] and "'2 s' is a duration" in err[0], err


def test_rows_the_engine_screened_are_not_scored(tmp_path, monkeypatch):
    """A glitch in the file (row 30: 1e40) that the engine flags as an outlier is neither a
    target nor a persistence forecast in replay's score: the NRMSE is that of the other pairs,
    computed here by hand (with it, the glitch alone made the score ~1)."""
    n = 60
    x = np.sin(0.3 * np.arange(n))
    x[30] = 1e40
    path = tmp_path / "glitch.csv"
    path.write_text("x\n" + "".join(f"{float(a)!r}\n" for a in x))

    def answer(xs, ys, k):                      # persistence, but for the glitch: the row before
        return np.array([x[k - 2] if k - 1 == 30 else xs[0]])
    monkeypatch.setattr("streamtrace.adapters.replay.SensorClient",
                        fake_sensor_client(answer, lambda xs, ys, k: {"outlier": True} if k - 1 == 30 else {}))
    r = replay(path, "ipc:///nowhere", columns=["x"], window=0)
    pred = np.array([x[i - 1] if i == 30 else x[i] for i in range(n)])[:-1]
    target, keep = x[1:], np.array([i not in (29, 30) for i in range(n - 1)])      # pairs touching row 30
    want = np.sqrt(np.mean((pred[keep] - target[keep]) ** 2)) / np.std(target[keep])
    assert r.events["outlier"] == 1 and len(r.scored_targets) == n - 3
    assert r.nrmse == pytest.approx(want, rel=1e-12) and r.nrmse < 0.5

