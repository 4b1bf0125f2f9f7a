"""``algo.over_slots``: N slots in one custom VJP (the learner's slot step). Its gradient of a
sum of per-slot losses must equal the sum of the one-slot gradients taken slot by slot
(the single-slot step is checked against BPTT / RTRL oracles elsewhere), with learning-signal
hooks too, and its outputs and new states must be the one-slot step's. float64."""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamtrace as st

N, N_IN, H, N_OUT = 3, 3, 4, 2

ALGOS = {"d-rtrl": lambda m, x, **kw: st.etrace.D_RTRL(m, x, **kw),
         "es-d-rtrl": lambda m, x, **kw: st.etrace.ES_D_RTRL(m, x, decay=0.6, **kw)}
HOOKS = {"none": lambda: None, "feedback": lambda: st.etrace.RandomFeedback(3), "kappa": lambda: st.etrace.KappaFilter(0.4)}


@pytest.mark.parametrize("hook", list(HOOKS))
@pytest.mark.parametrize("name", list(ALGOS))
def test_over_slots_equals_sum_of_single_slots(x64, name, hook):
    model = st.nn.Stack("gru", N_IN, H, N_OUT, seed=2)
    brainstate.nn.init_all_states(model)
    algo = ALGOS[name](model, jnp.zeros(N_IN), signal=HOOKS[hook]())
    p, h0, tr0 = algo.init_state()
    rng = np.random.default_rng(0)
    # nonzero hidden states and traces, different per slot (as after some steps)
    h = jax.tree_util.tree_map(lambda v: jnp.asarray(rng.normal(size=(N,) + v.shape)), h0)
    tr = jax.tree_util.tree_map(lambda v: jnp.asarray(rng.normal(size=(N,) + v.shape)), tr0)
    x = jnp.asarray(rng.normal(size=(N, N_IN)))
    y = jnp.asarray(rng.normal(size=(N, N_OUT)))
    w = jnp.asarray([1.0, 0.0, 2.5])          # a slot that does not learn contributes nothing

    def batched(p):
        out, h1, tr1 = algo.over_slots(p, h, tr, x)
        return jnp.sum(w * jnp.sum((out - y) ** 2, -1)), (out, h1, tr1)

    (_, (out, h1, tr1)), g = jax.value_and_grad(batched, has_aux=True)(p)
    g_sum = jax.tree_util.tree_map(jnp.zeros_like, p)
    for b in range(N):
        one = lambda t: jax.tree_util.tree_map(lambda v: v[b], t)

        def single(p):
            o, hb, trb = algo(p, one(h), one(tr), x[b])
            return w[b] * jnp.sum((o - y[b]) ** 2), (o, hb, trb)
        (_, (o, hb, trb)), gb = jax.value_and_grad(single, has_aux=True)(p)
        g_sum = jax.tree_util.tree_map(jnp.add, g_sum, gb)
        np.testing.assert_allclose(out[b], o, rtol=1e-12, atol=1e-12)
        for a, c in zip(jax.tree_util.tree_leaves((one(h1), one(tr1))), jax.tree_util.tree_leaves((hb, trb))):
            np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-12)
    assert set(g) == set(g_sum) == set(p)
    for k in p:
        np.testing.assert_allclose(g[k], g_sum[k], rtol=1e-10, atol=1e-12, err_msg=k)
    assert max(float(jnp.max(jnp.abs(v))) for v in g.values()) > 1e-3
