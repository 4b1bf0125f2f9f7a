"""Peers for the quality benchmark, each wrapped as a prequential step ``fn(x_t, y_t) -> prediction
of y_t`` that predicts first and learns after: reservoirpy's ESN + online RLS readout, river's
SNARIMAX and lagged regressions, and a plain jitted ESN + RLS step in jax (the cost floor)."""
from __future__ import annotations

from collections import deque

import numpy as np


# ---- reservoirpy ------------------------------------------------------------------------------
def reservoirpy_esn(units=500, lr=1.0, sr=0.9, input_scaling=1.0, alpha=1e-6, forgetting=1.0,
                    rc_connectivity=0.1, seed=0):
    """reservoirpy Reservoir -> RLS. ``RLS.partial_fit`` returns the prediction *after* its
    update, so the scored prediction is taken with ``rls.step`` before ``partial_fit``."""
    from reservoirpy.nodes import RLS, Reservoir
    res = Reservoir(units, lr=lr, sr=sr, input_scaling=input_scaling, rc_connectivity=rc_connectivity, seed=seed)
    rls = RLS(alpha=alpha, forgetting=forgetting)

    def step(x, y):
        r = res.step(np.atleast_1d(np.asarray(x, np.float64)))
        y = np.atleast_1d(np.asarray(y, np.float64))
        if not rls.initialized:
            rls.initialize(r[None], y[None])
        pred = np.array(rls.step(r), copy=True)       # before learning y
        rls.partial_fit(r[None], y[None])             # its return value has seen y: not scored
        return pred
    return step


# ---- river ------------------------------------------------------------------------------------
def river_snarimax(p=4, d=1, q=0, m=1, sp=0, sd=0, sq=0, lr=0.01):
    """SNARIMAX on a single series (forecast tasks): learn x_t, then forecast x_{t+1}."""
    from river import linear_model, optim, preprocessing, time_series
    model = time_series.SNARIMAX(p=p, d=d, q=q, m=m, sp=sp, sd=sd, sq=sq, regressor=(
        preprocessing.StandardScaler() | linear_model.LinearRegression(optimizer=optim.SGD(lr), intercept_lr=lr)))

    def step(x, y):
        model.learn_one(float(np.asarray(x).reshape(-1)[0]))
        return np.array([model.forecast(horizon=1)[0]])
    return step


def river_lagged(lags=10, kind="linear", lr=0.01, past_targets=False):
    """A river regressor on the last ``lags`` inputs (and, with ``past_targets``, the last
    ``lags`` targets, already revealed in a prequential stream: a supervised-task option the
    other learners here do not get), standardised features and target (river's StandardScaler
    and TargetStandardScaler). kind: "linear" (LinearRegression, SGD lr), "bayes"
    (BayesianLinearRegression) or "poly-bayes" (degree-2 PolynomialExtender first)."""
    from river import feature_extraction, linear_model, optim, preprocessing
    if kind == "linear":
        head = linear_model.LinearRegression(optimizer=optim.SGD(lr), intercept_lr=lr)
    elif kind == "bayes":
        head = linear_model.BayesianLinearRegression()
    elif kind == "poly-bayes":
        head = feature_extraction.PolynomialExtender(degree=2, include_bias=True) | \
            linear_model.BayesianLinearRegression()
    else:
        raise ValueError(f"kind {kind!r}")
    model = preprocessing.TargetStandardScaler(preprocessing.StandardScaler() | head)
    xs, ys = deque([0.0] * lags, maxlen=lags), deque([0.0] * lags, maxlen=lags)

    def step(x, y):
        xs.append(float(np.asarray(x).reshape(-1)[0]))
        feats = {f"x{i}": v for i, v in enumerate(xs)}
        if past_targets:
            feats.update({f"y{i}": v for i, v in enumerate(ys)})
        pred = model.predict_one(feats)
        target = float(np.asarray(y).reshape(-1)[0])
        model.learn_one(feats, target)
        ys.append(target)
        return np.array([pred])
    return step


# ---- jax floor ----------------------------------------------------------------------------------
def jax_esn_rls(units=500, n_in=1, n_out=1, lr=1.0, sr=0.9, input_scaling=1.0, delta=1e-6, forgetting=1.0,
                connectivity=0.1, seed=0, dtype="float32"):
    """A plain jitted ESN + RLS step (no framework): what one such step costs on this machine.
    P0 = I / delta; readout over [1, r]; the state crosses the call as three buffers."""
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(units, units)) * (rng.random((units, units)) < connectivity)
    W *= sr / np.max(np.abs(np.linalg.eigvals(W)))
    Win = input_scaling * rng.choice([-1.0, 1.0], size=(n_in, units)) * (rng.random((n_in, units)) < 0.1)
    if dtype == "float64":                     # jax's 64-bit mode (brainstate's switch)
        import brainstate
        brainstate.environ.set(precision=64)
    dt = jnp.dtype(dtype)
    W, Win = jnp.asarray(W, dt), jnp.asarray(Win, dt)

    @jax.jit
    def step(r, Wout, P, x, y):
        r = (1 - lr) * r + lr * jnp.tanh(x @ Win + r @ W)
        z = jnp.concatenate([jnp.ones(1, r.dtype), r])
        pred = z @ Wout
        Pz = P @ z
        c = forgetting + z @ Pz
        Wout = Wout + jnp.outer(Pz / c, y - pred)
        P = (P - jnp.outer(Pz, Pz) / c) / forgetting     # Pz_i Pz_j: symmetric to the last bit
        return r, Wout, P, pred

    state = [jnp.zeros(units, dt), jnp.zeros((units + 1, n_out), dt), jnp.eye(units + 1, dtype=dt) / delta]

    def fn(x, y):
        state[0], state[1], state[2], pred = step(state[0], state[1], state[2],
                                                  np.asarray(x, dt).reshape(n_in),
                                                  np.asarray(y, dt).reshape(n_out))
        return np.asarray(pred)
    return fn


def jax_esn_rls_step_us(units=500, calls=3000, seed=0, dtype="float32", delta=1e-4) -> tuple[float, float]:
    """The jitted ESN + RLS step alone in a tight loop (no scoring, no Python wrapper): median
    and 10th-percentile microseconds per call, the floor a learner of this size can reach."""
    from timing import timed
    fn = jax_esn_rls(units=units, delta=delta, seed=seed, dtype=dtype)
    xs = np.sin(0.1 * np.arange(calls + 1))
    fn(xs[0], xs[1])                                  # compile
    pairs = iter(zip(xs[:-1], xs[1:]))
    times = np.asarray(timed(lambda: fn(*next(pairs)), calls))   # fn returns numpy: synchronous
    return float(np.median(times) * 1e6), float(np.percentile(times, 10) * 1e6)
