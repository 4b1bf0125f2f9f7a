"""Streams to measure learning quality on: generated locally (no downloads), or read from a file.

Every task is a :class:`Task`: ``inputs[t]`` arrives at step t and ``targets[t]`` is what the
prediction made at step t is scored against. Forecast tasks have ``targets[t] = inputs[t + 1]``
(one step ahead); supervised tasks (NARMA-10) have a separate target channel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .files import FileError, is_gap, load_npy, number, read_table

__all__ = ["Task", "mackey_glass", "narma10", "lorenz", "co2", "sunspots", "load_file", "forward_fill", "get_task",
           "TASKS", "TaskError"]


class TaskError(ValueError):
    """A task name, file or series that cannot be evaluated."""


@dataclass(frozen=True)
class Task:
    name: str
    mode: str                 # "forecast" or "supervised"
    inputs: np.ndarray        # (T, n_in)
    targets: np.ndarray       # (T, n_out); forecast: targets[t] == inputs[t + 1]

    @property
    def steps(self) -> int:
        return len(self.inputs)

    @property
    def n_in(self) -> int:
        return self.inputs.shape[1]

    @property
    def n_out(self) -> int:
        return self.targets.shape[1]

    @staticmethod
    def forecast(name: str, series: np.ndarray) -> "Task":
        series = np.asarray(series, np.float64)
        if series.ndim == 1:
            series = series[:, None]
        if series.ndim != 2 or len(series) < 3:
            raise TaskError(f"{name}: need a (time, channels) series of at least 3 steps; got shape {series.shape}")
        if not np.all(np.isfinite(series)):
            raise TaskError(f"{name}: the series holds non-finite values")
        return Task(name, "forecast", series[:-1], series[1:])


# ---- generated ----------------------------------------------------------------------------
def _scale_pm1(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(), x.max()
    return 2.0 * (x - lo) / (hi - lo) - 1.0


def mackey_glass(n: int, tau: float = 17, seed: int = 0, *, a: float = 0.2, b: float = 0.1, power: int = 10,
                 x0: float = 1.2, substeps: int = 10, scale: bool = True) -> np.ndarray:
    """Mackey-Glass, dx/dt = a x(t - tau) / (1 + x(t - tau)^power) - b x(t), sampled every 1 time
    unit (as reservoirpy's generator does by default) and, by default, scaled to [-1, 1].

    Classical RK4 with step 1/substeps; the delayed value at the RK4 half step is the mean of its
    two grid neighbours. seed 0 is the standard start (constant history x0); other seeds perturb
    the history by +-0.1 uniformly. Returns shape (n,)."""
    if n < 1 or substeps < 1 or tau <= 0:
        raise TaskError("mackey_glass needs n >= 1, substeps >= 1 and tau > 0")
    h = 1.0 / substeps
    lag = int(round(tau * substeps))   # delay in fine steps
    if abs(lag * h - tau) > 1e-9:
        raise TaskError(f"tau = {tau} must be a multiple of 1/substeps = {h}")
    rng = np.random.default_rng(seed)
    hist = np.full(lag + 1, x0) if seed == 0 else x0 + 0.2 * (rng.random(lag + 1) - 0.5)
    total = (n - 1) * substeps
    x = [float(v) for v in hist] + [0.0] * total   # Python floats: ~10x faster than numpy scalars here
    x[lag] = float(x0)
    for i in range(lag, lag + total):
        d0, d1 = x[i - lag], x[i - lag + 1]
        dm = 0.5 * (d0 + d1)
        xt = x[i]
        k1 = a * d0 / (1.0 + d0 ** power) - b * xt
        fm = a * dm / (1.0 + dm ** power)
        k2 = fm - b * (xt + 0.5 * h * k1)
        k3 = fm - b * (xt + 0.5 * h * k2)
        k4 = a * d1 / (1.0 + d1 ** power) - b * (xt + h * k3)
        x[i + 1] = xt + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    x = np.asarray(x)
    out = x[lag::substeps][:n]
    return _scale_pm1(out) if scale else out


def narma10(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """NARMA-10 (Atiya & Parlos): with u_t ~ U[0, 0.5],
    y_{t+1} = 0.3 y_t + 0.05 y_t sum_{i=0..9} y_{t-i} + 1.5 u_{t-9} u_t + 0.1.

    Returns (u, y), each of shape (n,), aligned so that y[t] is the value the recurrence
    produces from u up to u[t] (the target for input u[t]). A warm-up of 200 steps from y = 0
    is dropped so the stream starts on the system's stationary behaviour."""
    if n < 1:
        raise TaskError("narma10 needs n >= 1")
    warm = 200
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.0, 0.5, n + warm)
    y = np.zeros(n + warm + 1)          # y[t + 1] is produced from u[t]
    for t in range(9, n + warm):
        y[t + 1] = 0.3 * y[t] + 0.05 * y[t] * y[t - 9:t + 1].sum() + 1.5 * u[t - 9] * u[t] + 0.1
    return u[warm:], y[warm + 1:]


def lorenz(n: int, seed: int = 0, *, dt: float = 0.02, sigma: float = 10.0, rho: float = 28.0,
           beta: float = 8.0 / 3.0) -> np.ndarray:
    """The Lorenz-63 system by RK4 (10 substeps per sample of dt), after a 20 time-unit
    transient, each channel standardised. Returns shape (n, 3)."""
    if n < 1:
        raise TaskError("lorenz needs n >= 1")
    rng = np.random.default_rng(seed)
    s = np.array([1.0, 1.0, 1.0]) + (0.0 if seed == 0 else rng.normal(0.0, 0.1, 3))

    def f(x, y, z):
        return sigma * (y - x), x * (rho - z) - y, x * y - beta * z

    sub, h = 10, dt / 10
    skip = int(round(20.0 / dt))
    out = np.empty((n, 3))
    x, y, z = (float(v) for v in s)
    for i in range(skip + n):
        for _ in range(sub):
            a1, b1, c1 = f(x, y, z)
            a2, b2, c2 = f(x + 0.5 * h * a1, y + 0.5 * h * b1, z + 0.5 * h * c1)
            a3, b3, c3 = f(x + 0.5 * h * a2, y + 0.5 * h * b2, z + 0.5 * h * c2)
            a4, b4, c4 = f(x + h * a3, y + h * b3, z + h * c3)
            x += h / 6.0 * (a1 + 2 * a2 + 2 * a3 + a4)
            y += h / 6.0 * (b1 + 2 * b2 + 2 * b3 + b4)
            z += h / 6.0 * (c1 + 2 * c2 + 2 * c3 + c4)
        if i >= skip:
            out[i - skip] = (x, y, z)
    return (out - out.mean(0)) / out.std(0)


# ---- real measured series shipped in statsmodels --------------------------------------------
def _statsmodels(name: str):
    try:
        from statsmodels import datasets
    except ImportError:
        raise TaskError(f"the '{name}' task reads a series shipped with statsmodels, which is not installed: "
                        "pip install 'streamtrace[quality]' (or pip install statsmodels)") from None
    return getattr(datasets, name).load_pandas().data


def forward_fill(x: np.ndarray) -> np.ndarray:
    """Causal gap filling: a missing value takes the last observed one; leading gaps take the
    first observed value (there is nothing earlier)."""
    x = np.array(x, np.float64)
    flat = x.reshape(len(x), -1)
    for c in range(flat.shape[1]):
        col = flat[:, c]
        ok = np.isfinite(col)
        if not ok.any():
            raise TaskError(f"channel {c} has no finite value")
        idx = np.where(ok, np.arange(len(col)), 0)
        np.maximum.accumulate(idx, out=idx)
        first = np.argmax(ok)
        filled = col[idx]
        filled[:first] = col[first]
        flat[:, c] = filled
    return flat.reshape(x.shape)


def co2() -> np.ndarray:
    """Weekly atmospheric CO2 at Mauna Loa, 1958-2001 (2284 weeks, ppm), gaps forward-filled."""
    return forward_fill(_statsmodels("co2")["co2"].to_numpy())


def sunspots() -> np.ndarray:
    """Yearly sunspot activity, 1700-2008 (309 years)."""
    return _statsmodels("sunspots")["SUNACTIVITY"].to_numpy(np.float64)


# ---- files --------------------------------------------------------------------------------
def load_file(path: str | Path) -> np.ndarray:
    """A (time, channels) series from a .npy, .parquet or CSV file (read by
    :func:`streamtrace.files.read_table`): every column whose cells are all numbers or gaps is a
    channel (a text column, a timestamp or a label, is not); gaps are forward-filled."""
    try:
        if Path(path).suffix.lower() == ".npy":
            return forward_fill(load_npy(path))
        table = read_table(path)
    except FileError as e:
        raise TaskError(str(e)) from None
    cols = [[number(c) for c in cells] for cells in table.columns.values()
            if all(is_gap(c) or not math.isnan(number(c)) for c in cells)]
    if not cols or len(table) < 3:
        raise TaskError(f"{path}: no numeric columns with at least 3 rows")
    return forward_fill(np.array(cols, np.float64).T)


# ---- by name ------------------------------------------------------------------------------
TASKS = ("mackey-glass", "narma10", "lorenz", "co2", "sunspots")


def get_task(name: str, steps: int = 6000, seed: int = 0) -> Task:
    """A task by name (see TASKS) or a CSV/NPY path; ``steps`` scored steps where the task is
    generated (a measured series gives what it has, at most ``steps``)."""
    if name == "mackey-glass":
        return Task.forecast(name, mackey_glass(steps + 1, seed=seed))
    if name == "narma10":
        u, y = narma10(steps, seed=seed)
        return Task(name, "supervised", u[:, None], y[:, None])
    if name == "lorenz":
        return Task.forecast(name, lorenz(steps + 1, seed=seed))
    if name in ("co2", "sunspots"):
        x = co2() if name == "co2" else sunspots()
        return Task.forecast(name, x[:steps + 1])
    if Path(name).suffix.lower() in (".csv", ".npy", ".txt") or Path(name).exists():
        return Task.forecast(Path(name).name, load_file(name)[:steps + 1])
    raise TaskError(f"unknown task {name!r}: choose one of {TASKS} or give a .csv/.npy file")
