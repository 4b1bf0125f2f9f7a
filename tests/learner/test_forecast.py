"""Forecast mode learns a generated signal online: the target of step t-1 is x_t."""
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

from models import CellNet

STEPS = 5000


def mackey_glass(n, tau=17.0, beta=0.2, gamma=0.1, power=10, substeps=10, warmup=500):
    """Mackey-Glass delay equation (Euler, dt = 1/substeps), sampled every unit, standardised."""
    h = 1.0 / substeps
    lag = int(round(tau / h))
    buf = [1.2] * (lag + 1)
    out = []
    for i in range((n + warmup) * substeps):
        x, xd = buf[-1], buf[-lag - 1]
        buf.append(x + h * (beta * xd / (1.0 + xd ** power) - gamma * x))
        if i % substeps == 0:
            out.append(buf[-1])
    s = np.asarray(out[warmup:warmup + n])
    return ((s - s.mean()) / s.std()).astype(np.float32)


SIGNALS = {"sine": lambda n: np.sin(0.07 * np.arange(n)).astype(np.float32),
           "mackey-glass": mackey_glass}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIGNALS))
def test_gru_forecast_error_falls_10x(name, capsys):
    signal = SIGNALS[name](STEPS)
    learner = st.OnlineLearner(CellNet(nn.GRUCell, n_in=1, n_hidden=16, n_out=1), np.zeros(1, np.float32),
                               mode="forecast", optimizer=optax.adam(2e-3))
    losses = np.array([learner.step(signal[t:t + 1]).loss[0] for t in range(STEPS)])
    assert np.isnan(losses[0])          # nothing was predicted before the first sample
    assert np.all(np.isfinite(losses[1:]))
    first, last = losses[1:301].mean(), losses[-300:].mean()
    with capsys.disabled():
        print(f"\n  forecast {name}: one-step-ahead MSE {first:.4f} -> {last:.5f} ({first / last:.0f}x)")
    assert first / last >= 10.0
    # prequential loss = mean of the per-step losses of predictions made before their target
    assert np.isclose(learner.stats()["prequential_loss"][0], losses[1:].mean(), rtol=1e-3)


def test_forecast_equals_reference_loop(x64):
    """Weights and predictions equal a slow loop written with jax.grad and the algorithm:
    at x_t, take the online gradient of loss(prediction made at t-1, x_t), update, then
    predict x_{t+1} from the state at t with the new weights."""
    import jax
    import jax.numpy as jnp
    import brainstate
    from streamtrace.etrace.model_fn import ModelFunction

    sig = np.sin(0.3 * np.arange(60))[:, None] + 0.1 * np.cos(0.7 * np.arange(60))[:, None]
    opt = optax.adam(1e-2)
    learner = st.OnlineLearner(CellNet(nn.GRUCell, n_in=1, n_hidden=6, n_out=1), np.zeros(1), mode="forecast",
                               optimizer=opt)
    preds = [learner.step(sig[t]).prediction for t in range(len(sig))]

    model = CellNet(nn.GRUCell, n_in=1, n_hidden=6, n_out=1)
    brainstate.nn.init_all_states(model)
    algo = st.etrace.D_RTRL(model, jnp.zeros(1))
    f = ModelFunction(model)
    p, h, tr = algo.init_state()
    opt_state = opt.init(p)
    prev = None

    def loss(p, h, tr, x_prev, x):
        out, h, tr = algo(p, h, tr, x_prev)
        return jnp.mean((out - x) ** 2), (h, tr)
    for t in range(len(sig)):
        x = jnp.asarray(sig[t])
        if prev is not None:
            g, (h, tr) = jax.grad(loss, has_aux=True)(p, *prev, x)
            updates, opt_state = opt.update(g, opt_state, p)
            p = optax.apply_updates(p, updates)
        want = f(p, h, x)[0]
        np.testing.assert_allclose(preds[t], want, rtol=1e-9, atol=1e-12, err_msg=f"step {t}")
        prev = (h, tr, x)
    for n in p:
        np.testing.assert_allclose(learner.params[n], p[n], rtol=1e-9, atol=1e-12)
