"""Online learning works: one optimizer update per step, on a generated signal.

Task: input (sin wt, cos wt), target 0.8 sin(wt - 1): learnable only if the network
carries the phase, and stationary so that the first and last windows are comparable.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

from models import CellNet

STEPS = 2000


def signal(steps):
    t = np.arange(steps)
    x = np.stack([np.sin(0.1 * t), np.cos(0.1 * t)], -1)[:, None, :]
    y = (0.8 * np.sin(0.1 * t - 1.0))[:, None, None]
    return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)


class LIFNet(brainstate.nn.Module):
    def __init__(self, n=32):
        super().__init__()
        self.inp = nn.Linear(2, n, key=jax.random.PRNGKey(0))
        self.lif = nn.LIF(n, tau=10.0)
        self.out = nn.LeakyRateReadout(n, 1, tau=5.0, key=jax.random.PRNGKey(1))

    def update(self, x):
        return self.out(self.lif(self.inp(x) * 2.0 + 0.5))


def learn(model, make_algo, steps=STEPS, lr=1e-3):
    brainstate.nn.init_all_states(model, 1)
    xs, ys = signal(steps)
    algo = make_algo(model, xs[0])
    params, hidden, traces = algo.init_state()
    opt = optax.adam(lr)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, hidden, traces, opt_state, x, y):
        def loss(p):
            out, h, tr = algo(p, hidden, traces, x)
            return jnp.mean((out - y) ** 2), (h, tr)
        (l, (h, tr)), g = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, updates), h, tr, opt_state, l

    losses = np.empty(steps)
    for t in range(steps):
        params, hidden, traces, opt_state, l = step(params, hidden, traces, opt_state, xs[t], ys[t])
        losses[t] = l
    return losses[:100].mean(), losses[-100:].mean()


ALGOS = {"d-rtrl": lambda m, x: st.etrace.D_RTRL(m, x), "es-d-rtrl": lambda m, x: st.etrace.ES_D_RTRL(m, x, decay=0.8)}


@pytest.mark.slow
@pytest.mark.parametrize("algo", list(ALGOS))
def test_gru_loss_falls_10x(algo, capsys):
    first, last = learn(CellNet(nn.GRUCell, n_in=2, n_hidden=16, n_out=1), ALGOS[algo], lr=5e-4)
    with capsys.disabled():
        print(f"\n  GRU {algo}: loss {first:.4f} -> {last:.5f} ({first / last:.0f}x)")
    assert first / last >= 10.0


@pytest.mark.slow
@pytest.mark.parametrize("algo", list(ALGOS))
def test_lif_loss_falls_3x(algo, capsys):
    first, last = learn(LIFNet(), ALGOS[algo])
    with capsys.disabled():
        print(f"\n  LIF {algo}: loss {first:.4f} -> {last:.5f} ({first / last:.0f}x)")
    assert first / last >= 3.0
