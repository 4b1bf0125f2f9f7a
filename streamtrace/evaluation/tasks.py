"""Streams to measure learning quality on: generated locally (no downloads), or read from a file.

Every task is a :class:`Task`: ``inputs[t]`` arrives at step t and ``targets[t]`` is what the
prediction made at step t is scored against. Forecast tasks have ``targets[t] = inputs[t + 1]``
(one step ahead); supervised tasks (NARMA-10) have a separate target channel.

Three tasks are about learning over a long stream (25,000 steps by default): ``multichannel``
(a lagged nonlinear target hidden in 4 of 32 channels), ``regime-switch`` (Mackey-Glass whose delay
changes mid-stream, scored just after the change: ``Task.score``) and ``delay-recall[:D]``.
:func:`mackey_glass_fleet` makes many streams with different delays for multi-stream runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .files import FileError, choose_columns, numbers, read_table

__all__ = ["Task", "mackey_glass", "mackey_glass_switch", "mackey_glass_fleet", "fleet_params", "multichannel",
           "delay_recall", "narma10", "lorenz", "co2", "sunspots", "load_file", "file_task", "forward_fill", "get_task",
           "default_steps", "TASKS", "TaskError"]


class TaskError(ValueError):
    """A task name, file or series that cannot be evaluated."""


@dataclass(frozen=True)
class Task:
    name: str
    mode: str                 # "forecast" or "supervised"
    inputs: np.ndarray        # (T, n_in)
    targets: np.ndarray       # (T, n_out); forecast: targets[t] == inputs[t + 1]
    # the steps [start, stop) the headline score is over; None: the last window (evaluate's --window)
    score: tuple[int, int] | None = None
    # further named [start, stop) spans to report (evaluate's Result.spans), e.g. before a change
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    note: str = ""            # what the user should hear about how the task was read (one line)

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

    def forecasting(self, channels) -> "Task":
        """This forecast task predicting only the input ``channels`` (the others are inputs
        alone, exogenous), as ``Forecast(channels=...)`` and ``learning.channels`` do.

        Example: ``Task.forecast("ab", np.ones((5, 2))).forecasting([1]).n_out`` is 1."""
        if self.mode != "forecast":
            raise TaskError(f"learning.channels chooses what a forecast predicts; task {self.name!r} is {self.mode}")
        ch = list(channels)
        if not ch or any(not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < self.n_in for c in ch):
            raise TaskError(f"learning.channels = {ch!r}: task {self.name!r} has input channels 0..{self.n_in - 1}")
        return Task(self.name, self.mode, self.inputs, self.targets[:, ch], self.score, self.spans, self.note)


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


def _mg_block(hist: np.ndarray, lags: np.ndarray, n: int, *, switch: tuple[int, int] | None = None,
              a: float = 0.2, b: float = 0.1, power: int = 10, substeps: int = 10) -> np.ndarray:
    """The integrator of :func:`mackey_glass` (same RK4 step, same half-step delay rule), for many
    streams at once and a delay that may change: vectorised over streams and over time.

    The delay is at least ``min(lags)`` fine steps, so that many steps ahead all delayed values are
    already known, and RK4 of x' = F - b x with F fixed by them is affine in x, x_{i+1} = c x_i + g_i:
    a block of that length is one cumulative sum. Equal to the scalar loop up to rounding.

    hist: (P + 1, S) values on the fine grid, hist[P] the value at sample 0 (P >= every lag);
    lags: (S,) delays in fine steps; switch: (sample, new lag in fine steps) for every stream
    from that sample on. Returns (n, S) samples, one per ``substeps`` fine steps."""
    h, S, P = 1.0 / substeps, hist.shape[1], len(hist) - 1
    lags = np.asarray(lags, np.int64)
    at, new = (switch[0] * substeps, np.full(S, int(switch[1]))) if switch is not None else (0, lags)
    block = int(min(lags.min(), new.min()))          # this many steps ahead, every delayed value is known
    size = int(max(lags.max(), new.max())) + block + 1   # a ring buffer of the past that is still read
    ring = np.empty((size, S))
    keep = np.arange(max(P + 1 - size, 0), P + 1)
    ring[keep % size] = hist[keep]
    # the affine step: c from x = 1 with no forcing, g from x = 0 with the forcing
    k1 = -b; k2 = -b * (1 + 0.5 * h * k1); k3 = -b * (1 + 0.5 * h * k2); k4 = -b * (1 + h * k3)  # noqa: E702
    c = 1.0 + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    f = lambda d: a * d / (1.0 + d ** power)                                                     # noqa: E731
    out = np.empty((n, S))
    out[0] = hist[P]
    cols = np.arange(S)
    total = (n - 1) * substeps
    for s in range(0, total, block):
        k = min(block, total - s)
        i = np.arange(s, s + k)[:, None]                 # fine steps since sample 0
        lag = lags if switch is None else np.where(i < at, lags, new)
        d0, d1 = ring[(P + i - lag) % size, cols], ring[(P + i - lag + 1) % size, cols]
        f0, f1, fm = f(d0), f(d1), f(0.5 * (d0 + d1))
        g1 = f0; g2 = fm - 0.5 * h * b * g1; g3 = fm - 0.5 * h * b * g2; g4 = f1 - h * b * g3   # noqa: E702
        g = h / 6.0 * (g1 + 2 * g2 + 2 * g3 + g4)
        pw = c ** np.arange(1, k + 1)[:, None]
        x = pw * (ring[(P + s) % size] + np.cumsum(g / pw, axis=0))   # x_{s+j+1} = c^(j+1) x_s + sum c^(j-m) g_m
        ring[(P + s + 1 + np.arange(k)) % size] = x
        done = s + 1 + np.arange(k)
        hit = done % substeps == 0
        out[done[hit] // substeps] = x[hit]
    return out


def mackey_glass_switch(n: int, seed: int = 0, *, tau: float = 17, new_tau: float = 30, at: int = 3000,
                        substeps: int = 10, scale: bool = True) -> np.ndarray:
    """Mackey-Glass whose delay switches from ``tau`` to ``new_tau`` at sample ``at``: one
    integration with a time-varying delay, so the state runs on continuously across the switch
    (only its dynamics change). Before the switch it is ``mackey_glass(n, tau, seed)`` (same start,
    same integrator up to rounding); scaled to [-1, 1] over the whole series by default.

    Statistics (unscaled, seed 0, 25,000 samples): with tau 17 (samples 200..2999) mean 0.93,
    std 0.23, first autocorrelation minimum at lag 24; with tau 30 (3500 on) mean 0.90, std 0.28,
    first minimum at lag 37 (a longer, more chaotic cycle), as a series run at tau 30 throughout
    has. Returns shape (n,)."""
    if n < 1 or at < 0 or min(tau, new_tau) <= 0:
        raise TaskError("mackey_glass_switch needs n >= 1, at >= 0 and positive delays")
    lag, new = (int(round(v * substeps)) for v in (tau, new_tau))
    if abs(lag / substeps - tau) > 1e-9 or abs(new / substeps - new_tau) > 1e-9:
        raise TaskError(f"tau = {tau} and new_tau = {new_tau} must be multiples of 1/substeps = {1 / substeps}")
    hist = _mg_history(lag, seed)[:, None]
    x = _mg_block(hist, np.array([lag]), n, switch=(at, new), substeps=substeps)[:, 0]
    return _scale_pm1(x) if scale else x


def _mg_history(lag: int, seed: int, x0: float = 1.2) -> np.ndarray:
    """The start :func:`mackey_glass` uses: lag + 1 fine-grid values ending in x0."""
    hist = np.full(lag + 1, x0) if seed == 0 else x0 + 0.2 * (np.random.default_rng(seed).random(lag + 1) - 0.5)
    hist[-1] = x0
    return hist


def fleet_params(n_streams: int, seed: int = 0) -> dict[str, np.ndarray]:
    """What each stream of :func:`mackey_glass_fleet` is: ``tau`` (delay, uniform on the 0.1 grid
    of [15, 25]), ``seed`` (of its random initial history, >= 1) and ``warmup`` (samples dropped
    before it starts, uniform in [200, 700): a random phase), each of shape (n_streams,)."""
    if n_streams < 1:
        raise TaskError(f"a fleet needs n_streams >= 1; got {n_streams}")
    rng = np.random.default_rng(seed)
    return {"tau": rng.integers(150, 251, n_streams) / 10.0, "seed": rng.integers(1, 2 ** 31, n_streams),
            "warmup": rng.integers(200, 700, n_streams)}


def mackey_glass_fleet(n_streams: int, steps: int, seed: int = 0) -> np.ndarray:
    """A fleet of Mackey-Glass streams, shape (n_streams, steps): stream i is
    ``mackey_glass(warmup + steps, tau, seed, scale=False)[warmup:]`` with its parameters from
    :func:`fleet_params`, scaled to [-1, 1] like ``get_task("mackey-glass")``; integrated for all
    streams at once (64 streams of 25,000 steps in about a second).

    Statistics: every row spans exactly [-1, 1]; delays 15..25 all give chaotic series (unscaled
    mean ~ 0.93, std ~ 0.23 at tau 17), the first autocorrelation minimum moving out with the delay."""
    if steps < 2:
        raise TaskError(f"a fleet needs steps >= 2; got {steps}")
    p = fleet_params(n_streams, seed)
    lags = np.round(p["tau"] * 10).astype(np.int64)
    P = int(lags.max())
    hist = np.empty((P + 1, n_streams))
    for i, (lag, s) in enumerate(zip(lags, p["seed"])):
        hist[P - lag:, i] = _mg_history(int(lag), int(s))   # rows before P - lag are never read
    x = _mg_block(hist, lags, int(p["warmup"].max()) + steps)
    out = np.stack([x[w:w + steps, i] for i, w in enumerate(p["warmup"])])
    lo, hi = out.min(1, keepdims=True), out.max(1, keepdims=True)
    return 2.0 * (out - lo) / (hi - lo) - 1.0


BANDS = ((0.01, 0.03), (0.05, 0.09), (0.12, 0.18), (0.25, 0.35))   # cycles per step, channels 0..3


def _band_limited(white: np.ndarray, band: tuple[float, float]) -> np.ndarray:
    spec = np.fft.rfft(white)
    f = np.fft.rfftfreq(len(white))
    spec[(f < band[0]) | (f > band[1])] = 0.0
    x = np.fft.irfft(spec, len(white))
    return (x - x.mean()) / x.std()


def multichannel(n: int, seed: int = 0, n_channels: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """A target hidden in a few of many channels, which needs memory. Returns (inputs (n, 32),
    targets (n,)).

    Channels 0..3 are s0..s3: Gaussian white noise kept only in the bands :data:`BANDS`
    (0.01-0.03, 0.05-0.09, 0.12-0.18, 0.25-0.35 cycles per step; all their power is there),
    standardised (mean 0, std 1). Channels 4..31 are Gaussian white noise, N(0, 1). The target
    is z standardised (mean 0, std 1 over the stream), where

        z_t = tanh(2 s0_{t-3}) s1_{t-5} + s2_{t-8} s3_{t-2} + 0.5 s0_{t-6}

    (lags 2 to 8 steps: a learner must hold the channels' past). The signals start 8 steps before
    the stream, so every target is defined."""
    if n < 2 or n_channels < 5:
        raise TaskError(f"multichannel needs n >= 2 and n_channels >= 5; got {n}, {n_channels}")
    rng = np.random.default_rng(seed)
    w = 8
    s = np.stack([_band_limited(rng.standard_normal(n + w), band) for band in BANDS], axis=1)

    def at(c, lag):                         # s_c at t - lag for t = 0..n-1
        return s[w - lag:w - lag + n, c]
    z = np.tanh(2 * at(0, 3)) * at(1, 5) + at(2, 8) * at(3, 2) + 0.5 * at(0, 6)
    noise = rng.standard_normal((n, n_channels - len(BANDS)))
    return np.concatenate([s[w:], noise], axis=1), (z - z.mean()) / z.std()


def delay_recall(n: int, delay: int = 15, seed: int = 0, noise: float = 0.1
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Recall the input of ``delay`` steps ago. u_t ~ N(0, 1) white; the input is u_t plus N(0,
    noise^2) observation noise (std sqrt(1 + noise^2) ~ 1.005); the target is y_t = u_{t-delay}
    (the clean value; u starts ``delay`` steps before the stream). A learner needs ``delay``
    steps of memory and gets no help from the signal's own structure (white: nothing to predict
    from). Returns (inputs, targets, clean u), each of shape (n,)."""
    if n < 1 or int(delay) != delay or delay < 1 or noise < 0:
        raise TaskError(f"delay_recall needs n >= 1, an integer delay >= 1 and noise >= 0; got {n}, {delay}, {noise}")
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(n + delay)
    clean = u[delay:]
    return clean + noise * rng.standard_normal(n), u[:n], clean


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
def _columns(path, columns=None, target=None, time_column=None):
    """The file's table and its columns chosen, errors as TaskError."""
    try:
        table = read_table(path)
        chosen = choose_columns(table, columns, target, time_column)
    except FileError as e:
        raise TaskError(f"{path}: {e}" if str(path) not in str(e) else str(e)) from None
    if len(table) < 3:
        raise TaskError(f"{path}: no numeric columns with at least 3 rows")
    return table, chosen


def _values(table, names) -> np.ndarray:
    return forward_fill(np.column_stack([numbers(table.columns[n]) for n in names]))


def load_file(path: str | Path) -> np.ndarray:
    """A (time, channels) series from a .npy, .parquet or CSV file (read by
    :func:`streamtrace.evaluation.files.read_table`): the columns :func:`streamtrace.evaluation.files.choose_columns`
    takes by default (mostly numbers; not a text column, a date-time, or a numeric column that
    looks like time); gaps and cells that are not numbers are forward-filled."""
    table, chosen = _columns(path)
    return _values(table, chosen.inputs)


def file_task(path: str | Path, steps: int | None = None, *, columns=None, target=None,
              time_column: str | None = None) -> Task:
    """A task from a recorded file: a forecast of the input columns, or with ``target`` (column
    names or positions) a supervised task predicting those columns from the inputs. The columns
    are chosen as ``streamtrace replay`` chooses them (:func:`streamtrace.evaluation.files.choose_columns`);
    ``Task.note`` says which time-like columns were left out. ``steps``: at most this many.

    Example: ``file_task("walk.csv", columns=["a", "b"], target=["y"]).mode`` is "supervised"."""
    table, chosen = _columns(path, columns, target, time_column)
    name, x = Path(path).name, _values(table, chosen.inputs)
    if chosen.targets:
        n = len(x) if steps is None else steps
        return Task(name, "supervised", x[:n], _values(table, chosen.targets)[:n], note=chosen.note)
    task = Task.forecast(name, x if steps is None else x[:steps + 1])
    return Task(task.name, task.mode, task.inputs, task.targets, note=chosen.note)


# ---- by name ------------------------------------------------------------------------------
TASKS = ("mackey-glass", "narma10", "lorenz", "co2", "sunspots", "multichannel", "regime-switch", "delay-recall")
LONG_TASKS = ("multichannel", "regime-switch", "delay-recall")   # continual learning: long streams by default
SWITCH_AT = 3000                                                  # regime-switch: tau 17 -> 30 here
SWITCH_SCORE, SWITCH_BEFORE = (3500, 4500), (2000, 3000)          # its scored span, and the one before


def _is_file(name: str) -> bool:
    return name not in TASKS and (Path(name).suffix.lower() in (".csv", ".npy", ".txt", ".parquet")
                                  or Path(name).exists())


def default_steps(name: str) -> int:
    """Steps ``get_task`` and ``streamtrace evaluate`` use when none are given: 25,000 for the
    tasks about learning over a long stream, 6,000 for the rest."""
    return 25000 if name.split(":")[0] in LONG_TASKS else 6000


def _delay(name: str) -> int:
    arg = name.partition(":")[2]
    if not arg:
        return 15
    if not arg.isdigit() or int(arg) < 1:
        raise TaskError(f"{name!r}: the delay after ':' must be an integer >= 1 (e.g. delay-recall:20)")
    return int(arg)


def get_task(name: str, steps: int | None = None, seed: int = 0, **file_columns) -> Task:
    """A task by name (see TASKS; ``delay-recall:D`` sets the delay) or a CSV/NPY/Parquet path;
    ``steps`` scored steps where the task is generated (a measured series gives what it has, at
    most ``steps``); None: :func:`default_steps`. ``file_columns`` (columns, target,
    time_column) choose a file's columns: :func:`file_task`.

    Example: ``get_task("narma10", 100).mode`` is "supervised"."""
    steps = default_steps(name) if steps is None else steps
    if _is_file(name):
        return file_task(name, steps, **file_columns)
    given = [k for k, v in file_columns.items() if v]
    if given:
        raise TaskError(f"{', '.join(given)} choose a file's columns; {name!r} is not a file")
    if name == "mackey-glass":
        return Task.forecast(name, mackey_glass(steps + 1, seed=seed))
    if name == "narma10":
        u, y = narma10(steps, seed=seed)
        return Task(name, "supervised", u[:, None], y[:, None])
    if name == "lorenz":
        return Task.forecast(name, lorenz(steps + 1, seed=seed))
    if name == "multichannel":
        x, y = multichannel(steps, seed=seed)
        return Task(name, "supervised", x, y[:, None])
    if name == "regime-switch":
        if steps < SWITCH_SCORE[1]:
            raise TaskError(f"regime-switch is scored on steps {SWITCH_SCORE[0]}..{SWITCH_SCORE[1] - 1}: "
                            f"needs steps >= {SWITCH_SCORE[1]}; got {steps}")
        task = Task.forecast(name, mackey_glass_switch(steps + 1, seed, at=SWITCH_AT))
        return Task(name, task.mode, task.inputs, task.targets, score=SWITCH_SCORE,
                    spans={"pre-switch": SWITCH_BEFORE, "post-switch": SWITCH_SCORE})
    if name.split(":")[0] == "delay-recall":
        x, y, _ = delay_recall(steps, _delay(name), seed)
        return Task(name, "supervised", x[:, None], y[:, None])
    if name in ("co2", "sunspots"):
        x = co2() if name == "co2" else sunspots()
        return Task.forecast(name, x[:steps + 1])
    raise TaskError(f"unknown task {name!r}: choose one of {TASKS} or give a .csv/.npy file")
