"""The evaluation streams against independent facts: a separate integrator of the equation, the
NARMA recurrence itself, the Lorenz equations by finite differences, reservoirpy's generator."""
import sys

import numpy as np
import pytest

from streamtrace.evaluation import tasks
from streamtrace.evaluation.tasks import TaskError


def test_mackey_glass_matches_a_fine_euler_integration():
    # independent oracle: forward Euler with a 20x finer step, same constant history (seed 0)
    T, h = 150, 0.002
    lag, n = int(round(17 / h)), int(round(T / h))
    x = [1.2] * (lag + 1) + [0.0] * n
    for i in range(lag, lag + n):
        d = x[i - lag]
        x[i + 1] = x[i] + h * (0.2 * d / (1 + d ** 10) - 0.1 * x[i])
    euler = np.array(x[lag::int(round(1 / h))])[:T + 1]
    mine = tasks.mackey_glass(T + 1, scale=False)
    assert mine[0] == 1.2
    np.testing.assert_allclose(mine, euler, atol=2e-3)


def test_mackey_glass_scaled_and_seeded():
    a, b = tasks.mackey_glass(3000), tasks.mackey_glass(3000, seed=1)
    assert a.min() == -1.0 and a.max() == 1.0
    np.testing.assert_array_equal(a, tasks.mackey_glass(3000))       # seed 0 is deterministic
    assert np.abs(a - b).max() > 0.1                                  # another seed: another start


def test_mackey_glass_same_attractor_as_reservoirpy():
    rpy = pytest.importorskip("reservoirpy.datasets")
    r = rpy.mackey_glass(20000).ravel()[1000:]
    m = tasks.mackey_glass(20000, scale=False)[1000:]
    assert abs(r.mean() - m.mean()) < 0.005 and abs(r.std() - m.std()) < 0.005
    np.testing.assert_allclose(np.quantile(m, [0.01, 0.1, 0.5, 0.9, 0.99]),
                               np.quantile(r, [0.01, 0.1, 0.5, 0.9, 0.99]), atol=0.01)

    def first_ac_minimum(s):
        s = s - s.mean()
        return 1 + int(np.argmin([s[:-k] @ s[k:] for k in range(1, 40)]))
    assert abs(first_ac_minimum(m) - first_ac_minimum(r)) <= 2


def test_narma10_satisfies_its_recurrence_exactly():
    u, y = tasks.narma10(2000, seed=3)
    assert u.shape == y.shape == (2000,)
    assert 0.0 <= u.min() and u.max() <= 0.5
    # y[t] is produced from u[t]: y[t] = .3 y[t-1] + .05 y[t-1] sum(y[t-10..t-1]) + 1.5 u[t-9] u[t] + .1
    for t in range(10, 2000):
        want = 0.3 * y[t - 1] + 0.05 * y[t - 1] * sum(y[t - 10:t]) + 1.5 * u[t - 9] * u[t] + 0.1
        assert y[t] == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert not np.array_equal(y, tasks.narma10(2000, seed=4)[1])


def test_lorenz_obeys_its_first_equation():
    s = tasks.lorenz(4000, dt=0.01)
    np.testing.assert_allclose(s.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(s.std(0), 1, atol=1e-12)
    # standardised channels keep x' = sigma (y - x) up to scale: the coefficient on x is -sigma
    d = (s[2:, 0] - s[:-2, 0]) / (2 * 0.01)
    A = np.column_stack([s[1:-1, 1], s[1:-1, 0], np.ones(len(d))])
    coef = np.linalg.lstsq(A, d, rcond=None)[0]
    assert coef[1] == pytest.approx(-10.0, rel=0.01)


def test_co2_is_weekly_ppm_forward_filled():
    pytest.importorskip("statsmodels")
    x = tasks.co2()
    raw = __import__("statsmodels.datasets", fromlist=["co2"]).co2.load_pandas().data["co2"].to_numpy()
    assert x.shape == raw.shape == (2284,) and np.isfinite(x).all()
    gaps = np.where(~np.isfinite(raw))[0]
    assert len(gaps) > 0 and gaps[0] > 0
    for g in gaps:                 # causal: a gap repeats the last value seen before it
        last = raw[:g][np.isfinite(raw[:g])][-1]
        assert x[g] == last
    assert 310 < x.min() and x.max() < 380
    assert tasks.get_task("co2", 6000).steps == 2283


def test_real_series_without_statsmodels_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "statsmodels", None)
    with pytest.raises(TaskError, match="statsmodels"):
        tasks.get_task("sunspots")


def test_load_file_csv_and_npy(tmp_path):
    csv = tmp_path / "s.csv"
    csv.write_text("time,a,label,b\n2024-01-01,1.0,x,10\n2024-01-02,,y,11\n2024-01-03,3.0,z,\n"
                   "2024-01-04,4.0,w,13\n")
    x = tasks.load_file(csv)
    np.testing.assert_array_equal(x, [[1, 10], [1, 11], [3, 11], [4, 13]])
    task = tasks.get_task(str(csv))
    assert task.mode == "forecast" and task.n_in == task.n_out == 2
    np.testing.assert_array_equal(task.targets, task.inputs[1:].tolist() + [[4, 13]])
    np.save(tmp_path / "s.npy", np.arange(5.0))
    assert tasks.load_file(tmp_path / "s.npy").shape == (5, 1)


def test_bad_tasks_and_files_are_named(tmp_path):
    with pytest.raises(TaskError, match="unknown task 'mackey'"):
        tasks.get_task("mackey")
    with pytest.raises(TaskError, match="no such file"):
        tasks.load_file(tmp_path / "missing.csv")
    (tmp_path / "t.csv").write_text("a,b\nx,y\nz,w\n")
    with pytest.raises(TaskError, match="no numeric columns"):
        tasks.load_file(tmp_path / "t.csv")
    np.save(tmp_path / "s.npy", np.array(["a", "b"]))
    with pytest.raises(TaskError, match="numeric"):
        tasks.load_file(tmp_path / "s.npy")


# ---- tasks where learning matters ---------------------------------------------------------
def _ac(x, k):
    x = x - x.mean()
    return float(x[:-k] @ x[k:] / (x @ x))


def _first_ac_minimum(x, up_to=60):
    return 1 + int(np.argmin([_ac(x, k) for k in range(1, up_to)]))


@pytest.mark.parametrize("make", [
    lambda seed: tasks.multichannel(500, seed),
    lambda seed: tasks.delay_recall(500, 7, seed),
    lambda seed: (tasks.mackey_glass_switch(400, seed, at=200),),
    lambda seed: (tasks.mackey_glass_fleet(3, 300, seed),),
], ids=["multichannel", "delay-recall", "regime-switch", "fleet"])
def test_new_generators_are_seeded(make):
    a, b, c = make(3), make(3), make(4)
    for x, y, z in zip(a, b, c):
        assert x.tobytes() == y.tobytes()            # same seed: the same bytes
        assert np.abs(x - z).max() > 0.1             # another seed: another stream


def test_multichannel_channels_have_their_documented_spectra():
    n = 20000
    x, y = tasks.multichannel(n, seed=1)
    assert x.shape == (n, 32) and y.shape == (n,)
    np.testing.assert_allclose(x.mean(0), 0, atol=0.05)
    np.testing.assert_allclose(x.std(0), 1, atol=0.05)
    f = np.fft.rfftfreq(n)
    for c, (lo, hi) in enumerate(tasks.BANDS):
        power = np.abs(np.fft.rfft(x[:, c])) ** 2
        assert power[(f >= lo) & (f <= hi)].sum() > 0.9 * power.sum(), c
        # a flat spectrum on [lo, hi] has lag-1 autocorrelation = the mean of cos(2 pi f) there
        want = (np.sin(2 * np.pi * hi) - np.sin(2 * np.pi * lo)) / (2 * np.pi * (hi - lo))
        assert _ac(x[:, c], 1) == pytest.approx(want, abs=0.05), c
    for c in range(4, 32):                          # noise: white, |autocorrelation| ~ 1/sqrt(n) = 0.007
        assert max(abs(_ac(x[:, c], k)) for k in range(1, 6)) < 0.035, c
    # the bands really differ: each signal's spectral centroid lies in its own band
    cents = [(f * np.abs(np.fft.rfft(x[:, c])) ** 2).sum() / (np.abs(np.fft.rfft(x[:, c])) ** 2).sum()
             for c in range(4)]
    assert all(lo < m < hi for m, (lo, hi) in zip(cents, tasks.BANDS))


def test_multichannel_target_is_its_formula_of_the_lagged_inputs():
    x, y = tasks.multichannel(3000, seed=2)
    s = x[:, :4]
    t = np.arange(8, 3000)                          # where every lag reaches back into the stream
    z = np.tanh(2 * s[t - 3, 0]) * s[t - 5, 1] + s[t - 8, 2] * s[t - 2, 3] + 0.5 * s[t - 6, 0]
    assert y.mean() == pytest.approx(0, abs=1e-12) and y.std() == pytest.approx(1, rel=1e-12)
    (alpha, beta), *_ = np.linalg.lstsq(np.column_stack([z, np.ones_like(z)]), y[t], rcond=None)
    assert alpha > 0
    np.testing.assert_allclose(y[t], alpha * z + beta, atol=1e-10)   # y is z standardised, exactly
    # and the noise channels carry nothing of it
    assert max(abs(np.corrcoef(x[t, c], y[t])[0, 1]) for c in range(4, 32)) < 0.1
    task = tasks.get_task("multichannel", 300, seed=2)
    assert (task.mode, task.n_in, task.n_out, task.steps) == ("supervised", 32, 1, 300)


def test_delay_recall_target_is_the_clean_input_delay_steps_back():
    x, y, u = tasks.delay_recall(4000, delay=15, seed=5)
    np.testing.assert_array_equal(y[15:], u[:-15])
    assert np.std(x - u) == pytest.approx(0.1, rel=0.05)         # the observation noise
    assert abs(np.corrcoef(x - u, u)[0, 1]) < 0.05
    assert max(abs(_ac(u, k)) for k in range(1, 6)) < 0.05         # white: no help from the past's shape
    for name, d in (("delay-recall", 15), ("delay-recall:20", 20)):
        task = tasks.get_task(name, 2000, seed=1)
        assert (task.mode, task.n_in, task.n_out, task.steps) == ("supervised", 1, 1, 2000)
        corr = lambda k: np.corrcoef(task.inputs[:-k, 0], task.targets[k:, 0])[0, 1]   # noqa: E731
        assert corr(d) > 0.99 and abs(corr(d - 1)) < 0.1 and abs(corr(d + 1)) < 0.1
    with pytest.raises(TaskError, match="delay-recall:x"):
        tasks.get_task("delay-recall:x", 100)


def test_regime_switch_follows_the_equation_with_each_delay():
    n = 6000
    x = tasks.mackey_glass_switch(n, scale=False)
    # before the switch: the scalar integrator's series at tau 17 (an independent loop)
    np.testing.assert_allclose(x[:3000], tasks.mackey_glass(3000, scale=False), atol=1e-7)

    def residual(tau, t):       # Simpson on [t-1, t+1] of dx/dt = 0.2 x(t-tau)/(1 + x(t-tau)^10) - 0.1 x(t)
        F = lambda s: 0.2 * x[s - tau] / (1 + x[s - tau] ** 10) - 0.1 * x[s]           # noqa: E731
        return np.sqrt(np.mean((x[t + 1] - x[t - 1] - (F(t - 1) + 4 * F(t) + F(t + 1)) / 3) ** 2))
    before, after = np.arange(200, 2999), np.arange(3032, n - 1)
    assert residual(17, before) * 1000 < residual(30, before)
    assert residual(30, after) * 1000 < residual(17, after)
    assert abs(x[3000] - x[2999]) < 0.1                  # continuous: no jump at the switch


def test_regime_switch_task_statistics_and_spans():
    x = tasks.mackey_glass_switch(25000, scale=False)
    pre, post = x[200:3000], x[3500:]
    assert pre.mean() == pytest.approx(0.93, abs=0.02) and pre.std() == pytest.approx(0.23, abs=0.02)
    assert post.mean() == pytest.approx(0.90, abs=0.02) and post.std() == pytest.approx(0.28, abs=0.02)
    assert abs(_first_ac_minimum(pre) - 24) <= 2 and abs(_first_ac_minimum(post) - 37) <= 2
    task = tasks.get_task("regime-switch", 5000)
    assert task.mode == "forecast" and task.steps == 5000
    assert task.score == (3500, 4500) and task.spans == {"pre-switch": (2000, 3000), "post-switch": (3500, 4500)}
    scaled = 2 * (x[:5001] - x[:5001].min()) / np.ptp(x[:5001]) - 1
    np.testing.assert_allclose(task.inputs[:, 0], scaled[:5000], atol=1e-12)
    np.testing.assert_array_equal(task.targets[:-1], task.inputs[1:])
    with pytest.raises(TaskError, match="needs steps >= 4500"):
        tasks.get_task("regime-switch", 4000)


def test_fleet_streams_are_the_scalar_series_with_their_delays():
    steps = 600
    p = tasks.fleet_params(3, seed=7)
    fleet = tasks.mackey_glass_fleet(3, steps, seed=7)
    assert fleet.shape == (3, steps)
    for i in range(3):
        tau, seed, warm = float(p["tau"][i]), int(p["seed"][i]), int(p["warmup"][i])
        ref = tasks.mackey_glass(warm + steps, tau=tau, seed=seed, scale=False)[warm:]
        np.testing.assert_allclose(fleet[i], 2 * (ref - ref.min()) / np.ptp(ref) - 1, atol=1e-6)
        other = tasks.mackey_glass(warm + steps, tau=tau + 1, seed=seed, scale=False)[warm:]
        assert np.abs(fleet[i] - (2 * (other - other.min()) / np.ptp(other) - 1)).max() > 0.1
        assert fleet[i].min() == -1.0 and fleet[i].max() == 1.0


def test_fleet_delays_and_phases_are_drawn_as_documented():
    p = tasks.fleet_params(500, seed=1)
    tau = p["tau"]
    assert tau.min() >= 15 and tau.max() <= 25 and tau.min() < 15.5 and tau.max() > 24.5
    np.testing.assert_allclose(tau * 10, np.round(tau * 10), atol=1e-9)      # on the 0.1 grid
    assert (p["seed"] >= 1).all() and len(set(p["seed"].tolist())) == 500
    assert p["warmup"].min() >= 200 and p["warmup"].max() < 700
    # streams with a longer delay have their first autocorrelation minimum further out
    p = tasks.fleet_params(40, seed=2)
    fleet = tasks.mackey_glass_fleet(40, 3000, seed=2)
    lo, hi = np.argmin(p["tau"]), np.argmax(p["tau"])
    assert _first_ac_minimum(fleet[lo]) < _first_ac_minimum(fleet[hi])


def test_long_tasks_default_to_25000_steps():
    assert [tasks.default_steps(n) for n in ("multichannel", "regime-switch", "delay-recall", "delay-recall:20")] \
        == [25000] * 4
    assert tasks.default_steps("mackey-glass") == tasks.default_steps("narma10") == 6000
    assert tasks.get_task("delay-recall").steps == 25000
    assert tasks.get_task("mackey-glass").steps == 6000
    assert {"multichannel", "regime-switch", "delay-recall"} <= set(tasks.TASKS)
