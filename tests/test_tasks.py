"""The evaluation streams against independent facts: a separate integrator of the equation, the
NARMA recurrence itself, the Lorenz equations by finite differences, reservoirpy's generator."""
import sys

import numpy as np
import pytest

from streamtrace import tasks
from streamtrace.tasks import TaskError


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
