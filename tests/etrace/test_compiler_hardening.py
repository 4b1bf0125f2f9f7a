"""The compiler accepts only what it can differentiate correctly (issue 8, items 10-13).

Oracles: BPTT by jax.grad through the unrolled model (model.update called directly, the
user's own custom rules included), float64.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamtrace as st
from streamtrace.etrace.errors import CompileError

from models import (bptt_grads, custom_leaky_net, mse, online_grads, rel_err, soft_clip, unit_norm, vjp_lif_net)

T = 30


def data(n_in=3, n_out=2, batch=2, steps=T, seed=1, scale=1.0):
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return (scale * jax.random.normal(kx, (steps, batch, n_in)), jax.random.normal(ky, (steps, batch, n_out)))


def worst_vs_bptt(model, algo, xs, ys, steps=(0, 3, 11, T - 1)):
    params, grads = online_grads(algo, xs, ys)
    hidden = algo.graph.init_hidden()
    worst = 0.0
    for t in steps:
        oracle = bptt_grads(model, params, hidden, xs, ys, t, mse)
        assert any(float(jnp.abs(oracle[n]).max()) > 1e-3 for n in algo.graph.trace_params), \
            "oracle gradient vanished: the test would not see an error"
        for n in params:
            worst = max(worst, rel_err(grads[t][n], oracle[n]))
    return worst


# --- item 10: custom_jvp -------------------------------------------------------------------------

def test_custom_jvp_that_mixes_neurons_is_refused_by_name(x64):
    model = custom_leaky_net(unit_norm)
    xs, _ = data()
    with pytest.raises(CompileError, match="unit_norm"):
        st.etrace.compile_graph(model, xs[0])


def test_elementwise_custom_jvp_in_the_recurrence_matches_bptt(x64):
    model = custom_leaky_net(soft_clip)
    xs, ys = data()
    algo = st.etrace.D_RTRL(model, xs[0])
    assert worst_vs_bptt(model, algo, xs, ys) <= 1e-6


# --- item 11: custom_vjp -------------------------------------------------------------------------

@pytest.mark.parametrize("nested", [False, True], ids=["top-level", "inside-jit"])
def test_custom_vjp_surrogate_lif_matches_bptt(x64, nested):
    """A LIF whose spike is a custom_vjp learns with D-RTRL; BPTT goes through the same
    custom_vjp (its bwd) by jax.grad."""
    from models import JitVjpLIF, Stack, make
    model = make(Stack(JitVjpLIF)) if nested else vjp_lif_net()
    xs, ys = data(scale=2.0)
    algo = st.etrace.D_RTRL(model, xs[0])
    assert worst_vs_bptt(model, algo, xs, ys) <= 1e-6


def test_custom_vjp_that_mixes_neurons_is_refused_by_name(x64):
    @jax.custom_vjp
    def pool(v):
        return v - jnp.mean(v, axis=-1, keepdims=True)
    pool.defvjp(lambda v: (pool(v), None), lambda _, g: (g - jnp.mean(g, axis=-1, keepdims=True),))
    model = custom_leaky_net(pool)
    xs, _ = data()
    with pytest.raises(CompileError, match="pool"):
        st.etrace.compile_graph(model, xs[0])


# --- item 12: weights written as plain jax / brainstate layers ------------------------------------

@pytest.mark.parametrize("neuron", ["lif", "leaky"])
def test_brainstate_linear_input_layer_is_traced_and_matches_bptt(x64, neuron):
    from models import BrainstateLinearNet, make
    from streamtrace import nn
    cell = {"lif": lambda n: nn.LIF(n, tau=5.0), "leaky": lambda n: nn.LeakyRate(n, tau=4.0)}[neuron]
    model = make(BrainstateLinearNet(cell, gain=3.0 if neuron == "lif" else 1.0))
    xs, ys = data(scale=2.0)
    algo = st.etrace.D_RTRL(model, xs[0])
    assert set(algo.graph.trace_params) == {"inp.weight.weight", "inp.weight.bias"}
    assert worst_vs_bptt(model, algo, xs, ys) <= 1e-6


def test_plain_matmul_and_elementwise_gain_are_traced_and_match_bptt(x64):
    from models import PlainGainNet, make
    model = make(PlainGainNet())
    xs, ys = data()
    algo = st.etrace.D_RTRL(model, xs[0])
    assert set(algo.graph.trace_params) == {"W", "b", "g"}
    assert worst_vs_bptt(model, algo, xs, ys) <= 1e-6


def test_brainstate_vanilla_rnn_cell_gets_traces():
    model = brainstate.nn.ValinaRNNCell(3, 5)
    brainstate.nn.init_all_states(model, 2)
    g = st.etrace.compile_graph(model, jnp.ones((2, 3)))
    assert set(g.trace_params) == {"W.weight.weight", "W.weight.bias"}


@pytest.mark.parametrize("cell", ["GRUCell", "LSTMCell"])
def test_brainstate_gated_cells_are_refused_with_the_reason(cell):
    """Their gates share one weight whose output is split: not one hidden group per op."""
    model = getattr(brainstate.nn, cell)(3, 5)
    brainstate.nn.init_all_states(model, 2)
    with pytest.raises(CompileError, match=r"W\w*\.weight\.weight.*through `split`"):
        st.etrace.compile_graph(model, jnp.ones((2, 3)))


def test_plain_parameter_that_changes_a_state_warns_at_compile_time():
    class LearnedLeak(brainstate.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n = n
            self.theta = brainstate.ParamState(jnp.zeros(n))

        def init_state(self, batch_size=None, **kw):
            self.v = brainstate.HiddenState(jnp.zeros((batch_size, self.n)))

        def update(self, x):
            a = jax.nn.sigmoid(self.theta.value)     # a computed decay: no weight op to trace
            self.v.value = a * self.v.value + (1 - a) * x
            return self.v.value
    from models import Stack, make
    model = make(Stack(LearnedLeak, gain=1.0))
    with pytest.warns(st.etrace.CompileWarning, match=r"cell\.theta.*hidden state 'cell\.v'"):
        g = st.etrace.compile_graph(model, jnp.ones((2, 3)))
    assert "WARNING" in g.explain("cell.theta")


# --- item 13: when D-RTRL is exact, and explain() says when it is not ------------------------------

@pytest.mark.parametrize("readout", ["linear", "leaky"])
def test_d_rtrl_is_exact_only_without_a_second_group_and_explain_says_so(x64, readout):
    from models import make
    model = make(st.nn.Stack("lif", n_in=3, n_hidden=5, n_out=2, readout=readout, gain=3.0))
    xs, ys = data(scale=2.0)
    algo = st.etrace.D_RTRL(model, xs[0])
    params, grads = online_grads(algo, xs, ys)
    hidden = algo.graph.init_hidden()
    err = {n: 0.0 for n in params}
    for t in (5, 17, T - 1):
        oracle = bptt_grads(model, params, hidden, xs, ys, t, mse)
        assert float(jnp.abs(oracle["inp.W"]).max()) > 1e-3
        for n in params:
            err[n] = max(err[n], rel_err(grads[t][n], oracle[n]))
    explain = algo.graph.explain()
    if readout == "linear":
        assert max(err.values()) <= 1e-6, err
        assert "WARNING" not in explain
    else:
        # the readout's own weight is exact; the input weight's trace misses the readout's memory
        assert err["out.W"] <= 1e-6 and err["inp.W"] > 1e-2, err
        assert "WARNING" in algo.graph.explain("inp.W") and "'out.r'" in algo.graph.explain("inp.W")
        assert "WARNING" not in algo.graph.explain("out.W")


def test_per_neuron_time_constants_stay_exact(x64):
    """Stack(tau=(min, max)) gives each neuron its own decay: still element-wise, still exact."""
    from models import make
    model = make(st.nn.Stack("alif", n_in=3, n_hidden=5, n_out=2, readout="linear", gain=3.0, tau=(1.0, 20.0),
                             bias_spread=1.0))
    assert np.ptp(np.asarray(model.cell.alpha)) > 0.3 and np.ptp(np.asarray(model.inp.b.value)) > 0.1
    xs, ys = data(scale=2.0)
    algo = st.etrace.D_RTRL(model, xs[0])
    assert worst_vs_bptt(model, algo, xs, ys) <= 1e-6


@pytest.mark.parametrize("bad", [dict(tau=(5.0, 1.0)), dict(tau=(1.0,)), dict(tau=-1.0), dict(bias_spread=-1.0)])
def test_stack_refuses_bad_time_constants(bad):
    with pytest.raises(ValueError, match="tau|bias_spread|time constant"):
        st.nn.Stack("lif", n_in=1, n_hidden=4, n_out=1, **bad)


@pytest.mark.parametrize("kind", ["lif", "alif", "leaky"])
def test_default_neuron_stack_reads_out_without_a_second_group(kind):
    model = st.nn.Stack(kind, n_in=2, n_hidden=4, n_out=1)
    brainstate.nn.init_all_states(model)
    g = st.etrace.compile_graph(model, jnp.zeros(2))
    assert len(g.groups) == 1 and "WARNING" not in g.explain()
