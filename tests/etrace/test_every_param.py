"""Every trainable parameter gets its gradient, instant ones included (the reference
library returns zero for a Linear readout in single-step mode; we must not)."""
import jax
import jax.numpy as jnp
import pytest

import streamtrace as st
from streamtrace.etrace.model_fn import ModelFunction

from models import (alif_net, chained_net, diag_rnn_net, gru_net, lif_net, lstm_net, mse, rate_net,
                    rel_err, rnn_net, two_layer_rate_net)

STACKS = {"lif": lif_net, "alif": alif_net, "leaky-rate": rate_net, "two-layer-rate": two_layer_rate_net,
          "diag-rnn": diag_rnn_net, "gru": gru_net, "lstm": lstm_net, "rnn": rnn_net, "chained": chained_net}
ALGOS = {"d-rtrl": lambda m, x: st.etrace.D_RTRL(m, x), "es-d-rtrl": lambda m, x: st.etrace.ES_D_RTRL(m, x, rank=4)}


def _run(algo, xs, ys, steps):
    params, hidden, traces = algo.init_state()

    def loss(p, h, tr, x, y):
        out, h, tr = algo(p, h, tr, x)
        return mse(out, y), (h, tr)
    step = jax.jit(jax.grad(loss, has_aux=True))
    for t in range(steps):
        h_before = hidden
        g, (hidden, traces) = step(params, hidden, traces, xs[t], ys[t])
    return params, h_before, g


def _data(seed=3, steps=12):
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(kx, (steps, 2, 3)) * 2.0, jax.random.normal(ky, (steps, 2, 2))


@pytest.mark.parametrize("algo_name", list(ALGOS))
@pytest.mark.parametrize("stack", list(STACKS))
def test_readout_gradient_is_exact_one_step_gradient(x64, stack, algo_name):
    model = STACKS[stack]()
    xs, ys = _data()
    algo = ALGOS[algo_name](model, xs[0])
    params, h_prev, g = _run(algo, xs, ys, steps=10)
    instant = algo.graph.instant_params
    f = ModelFunction(model)
    # oracle: jax.grad of this step's loss w.r.t. the instant params, from the same state
    oracle = jax.grad(lambda ip: mse(f({**params, **ip}, h_prev, xs[9])[0], ys[9]))(
        {n: params[n] for n in instant})
    for n in instant:
        assert rel_err(g[n], oracle[n]) <= 1e-9, n
    # and no parameter of any stack ends with an all-zero gradient after 10 steps
    for n in params:
        assert float(jnp.abs(g[n]).max()) > 0.0, f"{stack}/{algo_name}: '{n}' got an all-zero gradient"


@pytest.mark.parametrize("stack", list(STACKS))
def test_first_step_is_exact_for_every_stack(x64, stack):
    """From zero traces, step 0 has no history: every algorithm must give jax.grad of L_0
    exactly, on any architecture. This checks the learning signal through layers (a lower
    layer's new state feeding an upper one) and within a group (LSTM c_t -> h_t)."""
    model = STACKS[stack]()
    xs, ys = _data()
    f = ModelFunction(model)
    a = 0.3
    for algo in (st.etrace.D_RTRL(model, xs[0]), st.etrace.ES_D_RTRL(model, xs[0], decay=a), st.etrace.RTRL(model, xs[0])):
        params, h0, g = _run(algo, xs, ys, steps=1)
        oracle = jax.grad(lambda p: mse(f(p, h0, xs[0])[0], ys[0]))(params)
        # ES-D-RTRL's fbar carries a (1 - a) normalisation (etrace/es_d_rtrl.py): at step 0 its
        # matmul-weight gradients are (1 - a) times the exact ones
        scaled = {p for r in algo.graph.traced_relations if r.kind == "matmul" for p in r.params} \
            if isinstance(algo, st.etrace.ES_D_RTRL) else set()
        for n in params:
            want = oracle[n] * (1 - a) if n in scaled else oracle[n]
            assert rel_err(g[n], want) <= 1e-9, (algo.name, n)
