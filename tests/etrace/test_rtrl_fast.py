"""Exact RTRL (sensitivity propagated as M = J_h M + J_theta) against BPTT, float64, at every
step of a 40-step run: GRU, LSTM and an adaptive LIF (two states per neuron); the algorithm
alone with frozen weights, and inside the learner with slots (supervised) and in forecast mode.

The learner changes its weights every step, so its oracle is BPTT through the unrolled
history with the weights each step really used, differentiated with respect to one common
shift of all of them (which is what the online sensitivity accumulates). The learner's
gradient is read back from plain SGD: g_t = (theta_t - theta_{t+1}) / lr.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace.etrace.model_fn import ModelFunction
from streamtrace.etrace.rtrl import params_reaching_hidden

from models import alif_net, gru_net, lstm_net, rel_err

T = 40
TOL = 1e-9
LR = 0.05


def bptt_oracle(step, loss):
    """BPTT: (thetas, h0, xs, ys) -> for every t, d loss_t / d delta at delta = 0 where step
    t's loss runs through steps 0..t, each step s with weights thetas[s] + delta."""
    def grads(thetas, h0, xs, ys):
        def losses(delta):
            def body(h, inp):
                th, x, y = inp
                out, h = step({n: th[n] + delta[n] for n in th}, h, x)
                return h, loss(out, y)
            return jax.lax.scan(body, h0, (thetas, xs, ys))[1]
        return jax.jacrev(losses)({n: jnp.zeros_like(v[0]) for n, v in thetas.items()})
    return grads


def unrolled_grads(step, thetas, h0, xs, ys, loss):
    """{name: (T, ...)}: the BPTT gradient of every step's loss."""
    return jax.jit(bptt_oracle(step, loss))(thetas, h0, xs, ys)


def sum_sq(out, y):
    return jnp.sum((out - y) ** 2)


def mse(out, y):
    return jnp.mean((out - y) ** 2)


def slot_mean_mse(out, y):
    return jnp.mean(jnp.mean((out - y) ** 2, axis=-1))


def check_every_step(online, oracle, names, steps):
    worst = 0.0
    for n in names:
        assert float(jnp.abs(oracle[n]).max()) > 1e-6, f"oracle gradient of {n} vanished"
        for t in steps:
            err = rel_err(jnp.asarray(online[t][n]), oracle[n][t])
            assert err <= TOL, (n, t, err)
            worst = max(worst, err)
    return worst


MODELS = {"gru": gru_net, "lstm": lstm_net, "alif": alif_net}


@pytest.mark.parametrize("kind", list(MODELS))
def test_rtrl_equals_bptt_at_every_step(x64, kind):
    model = MODELS[kind]()           # a batch of 2 inside the model
    kx, ky = jax.random.split(jax.random.PRNGKey(3))
    xs = 1.5 * jax.random.normal(kx, (T, 2, 3))
    ys = jax.random.normal(ky, (T, 2, 2))
    algo = st.etrace.RTRL(model, xs[0])
    params, hidden, traces = algo.init_state()

    def loss(p, h, tr, x, y):
        out, h, tr = algo(p, h, tr, x)
        return sum_sq(out, y), (h, tr)
    step = jax.jit(jax.grad(loss, has_aux=True))
    online = []
    for t in range(T):
        g, (hidden, traces) = step(params, hidden, traces, xs[t], ys[t])
        online.append(g)

    thetas = {n: jnp.broadcast_to(v, (T,) + v.shape) for n, v in params.items()}
    oracle = unrolled_grads(ModelFunction(model), thetas, algo.graph.init_hidden(), xs, ys, sum_sq)
    check_every_step(online, oracle, params, range(T))


def test_sensitivity_holds_only_parameters_that_reach_the_state():
    model = st.nn.Stack("gru", 2, 4, 3)
    brainstate.nn.init_all_states(model)
    algo = st.etrace.RTRL(model, jnp.zeros(2))
    reach = params_reaching_hidden(algo.graph)
    assert set(reach) == {n for n in algo.graph.param_names if n.startswith("cell.")}
    p0 = algo.graph.init_params()
    assert {n: v.shape for n, v in algo.init_traces().items()} == \
        {f"sensitivity.{n}": (int(np.size(p0[n])), 4) for n in reach}


def _learner_run(model, mode, slots, xs, ys, shared_weights=True):
    """Steps of a float64 SGD learner; per step the weights it started from and the
    gradient it applied."""
    learner = st.OnlineLearner(model, np.zeros(xs.shape[-1]), algorithm="rtrl", mode=mode, slots=slots,
                               optimizer=optax.sgd(LR), shared_weights=shared_weights)
    thetas, grads = [], []
    for t in range(len(xs)):
        before = learner.params
        learner.step(xs[t], None if ys is None else ys[t])
        after = learner.params
        thetas.append(before)
        grads.append({n: (before[n] - after[n]) / LR for n in before})
    return learner, thetas, grads


LEARNER_MODELS = {"gru": lambda: st.nn.Stack("gru", 2, 6, 2),
                  "lstm": lambda: st.nn.Stack("lstm", 2, 5, 2),
                  "alif": lambda: st.nn.Stack("alif", 2, 6, 2, gain=3.0)}


def _stack(rows):
    return {n: jnp.stack([jnp.asarray(r[n]) for r in rows]) for n in rows[0]}


@pytest.mark.parametrize("kind", list(LEARNER_MODELS))
def test_learner_rtrl_with_slots_equals_bptt_of_the_weights_it_used(x64, kind):
    N = 3
    rng = np.random.default_rng(7)
    xs = 1.5 * rng.standard_normal((T, N, 2))
    ys = np.sin(np.cumsum(xs, axis=0))
    model = LEARNER_MODELS[kind]()
    learner, thetas, grads = _learner_run(model, "supervised", N, xs, ys)
    assert learner.stats()["updates"] == T
    f = ModelFunction(model)
    h0 = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (N,) + v.shape), f.hidden_values())
    slots_step = jax.vmap(lambda p, h, x: f(p, h, x), in_axes=(None, 0, 0))
    oracle = unrolled_grads(slots_step, _stack(thetas), h0, jnp.asarray(xs), jnp.asarray(ys), slot_mean_mse)
    check_every_step(grads, oracle, thetas[0], range(T))


def test_learner_rtrl_with_per_slot_weights_equals_bptt_per_slot(x64):
    """Each slot its own model: slot n's gradient is BPTT of its own loss through its own
    weight history (one oracle per slot, vmapped)."""
    N = 2
    rng = np.random.default_rng(5)
    xs = 1.5 * rng.standard_normal((T, N, 2))
    ys = np.cos(np.cumsum(xs, axis=0))
    model = LEARNER_MODELS["gru"]()
    learner, thetas, grads = _learner_run(model, "supervised", N, xs, ys, shared_weights=False)
    assert learner.stats()["updates"] == N * T
    f = ModelFunction(model)
    h0 = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (N,) + v.shape), f.hidden_values())
    oracle = jax.jit(jax.vmap(bptt_oracle(f, mse), in_axes=(1, 0, 1, 1)))(
        _stack(thetas), h0, jnp.asarray(xs), jnp.asarray(ys))
    for n in range(N):
        check_every_step([{k: v[n] for k, v in g.items()} for g in grads],
                         {k: v[n] for k, v in oracle.items()}, thetas[0], range(T))


@pytest.mark.parametrize("kind", list(LEARNER_MODELS))
def test_learner_rtrl_forecast_equals_bptt_of_the_weights_it_used(x64, kind):
    """Call t replays the step on x_{t-1} (from the state after x_{t-2}) with the weights
    held at the start of call t and learns from its error on x_t; call 0 only stores x_0."""
    N = 2
    rng = np.random.default_rng(11)
    t_ax = np.arange(T + 1)[:, None, None]
    xs = np.sin(0.4 * t_ax + rng.uniform(0, 6, (1, N, 2))) + 0.2 * rng.standard_normal((T + 1, N, 2))
    model = LEARNER_MODELS[kind]()
    learner, thetas, grads = _learner_run(model, "forecast", N, xs, None)
    assert learner.stats()["updates"] == T
    f = ModelFunction(model)
    h0 = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (N,) + v.shape), f.hidden_values())
    slots_step = jax.vmap(lambda p, h, x: f(p, h, x), in_axes=(None, 0, 0))
    # replayed step s = 1..T: weights of call s, input x_{s-1}, target x_s
    oracle = unrolled_grads(slots_step, _stack(thetas[1:]), h0, jnp.asarray(xs[:-1]), jnp.asarray(xs[1:]),
                            slot_mean_mse)
    assert all(float(np.abs(g).max()) == 0.0 for g in grads[0].values())
    check_every_step(grads[1:], oracle, thetas[0], range(T))
