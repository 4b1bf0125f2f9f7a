"""Fixed parameters (a frozen parameter group): no trace, no gradient, and the other
parameters' online gradients still equal BPTT's (jax.grad through the unrolled history with
the fixed weights held), float64."""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

from models import bptt_grads, gru_net, make, mse, online_grads, rel_err

T = 30


class TwoCells(brainstate.nn.Module):
    """Two element-wise recurrent cells side by side (D-RTRL is exact) -> Linear readout."""

    def __init__(self, n_in=3, seed=0):
        super().__init__()
        k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
        self.cells = nn.Beside(fixed=nn.DiagRNNCell(n_in, 4, key=k1), learned=nn.DiagRNNCell(n_in, 5, key=k2))
        self.out = nn.Linear(9, 2, key=k3)

    def update(self, x):
        return self.out(self.cells(x))


def data(steps=T, seed=1):
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(kx, (steps, 2, 3)), jax.random.normal(ky, (steps, 2, 2))


def fixed_names(algo_or_model, prefix):
    names = st.etrace.model_fn.ModelFunction(algo_or_model).param_names
    return tuple(n for n in names if n.startswith(prefix))


def check_against_bptt(model, algo, fixed, xs, ys):
    params, grads = online_grads(algo, xs, ys)
    hidden = algo.graph.init_hidden()
    learned = [n for n in params if n not in fixed]
    worst, fixed_size = 0.0, 0.0
    for t in (0, 5, T - 1):
        oracle = bptt_grads(model, params, hidden, xs, ys, t, mse)
        fixed_size = max([fixed_size] + [float(jnp.abs(oracle[n]).max()) for n in fixed])
        for n in fixed:
            assert not np.any(np.asarray(grads[t][n])), f"fixed {n} got a gradient"
        for n in learned:
            worst = max(worst, rel_err(grads[t][n], oracle[n]))
    assert fixed_size > 1e-3, "the fixed weights matter to the loss: a test that would see them learn"
    assert worst <= 1e-6, worst


def test_d_rtrl_with_a_fixed_cell_keeps_no_trace_for_it_and_equals_bptt_on_the_rest(x64):
    model = make(TwoCells())
    fixed = fixed_names(model, "cells.fixed.")
    assert len(fixed) >= 2
    xs, ys = data()
    algo = st.etrace.D_RTRL(model, xs[0], fixed=fixed)
    assert algo.graph.fixed_params == fixed
    traces = algo.init_traces()
    assert not [k for k in traces if any(k.endswith(n) for n in fixed)], sorted(traces)
    assert [k for k in traces if "cells.learned." in k], "the learned cell keeps its traces"
    assert "fixed" in algo.graph.explain(weight="cells.fixed.")
    check_against_bptt(model, algo, fixed, xs, ys)


def test_exact_rtrl_with_fixed_gate_weights_equals_bptt_on_the_rest(x64):
    model = gru_net()
    fixed = fixed_names(model, "cell.r.")
    xs, ys = data()
    algo = st.etrace.RTRL(model, xs[0], fixed=fixed)
    assert not [k for k in algo.init_traces() if any(k.endswith(n) for n in fixed)]
    check_against_bptt(model, algo, fixed, xs, ys)


def test_es_d_rtrl_keeps_no_trace_for_fixed_weights(x64):
    model = gru_net()
    fixed = fixed_names(model, "cell.z.")     # the update gate: traced unless fixed
    xs, _ = data()
    full, part = st.etrace.ES_D_RTRL(model, xs[0], decay=0.9), st.etrace.ES_D_RTRL(model, xs[0], decay=0.9, fixed=fixed)
    dropped = set(full.init_traces()) - set(part.init_traces())
    assert dropped and all(any(n in k for n in fixed) for k in dropped), dropped


def test_unknown_fixed_name_is_refused_by_name():
    model = gru_net()
    with pytest.raises(ValueError, match="cell.q.W"):
        st.etrace.D_RTRL(model, jnp.zeros((2, 3)), fixed=("cell.q.W",))


def test_learner_frozen_group_is_fixed_and_never_moves():
    """A frozen parameter group becomes the algorithm's fixed parameters: its weights keep their
    values bit for bit while the rest learn, and its traces are not in the learner's state."""
    model = TwoCells()
    opt = st.param_groups(fixed=("cells.fixed.*", None), rest=("*", optax.sgd(0.05)))
    learner = st.OnlineLearner(model, np.zeros(3, np.float32), optimizer=opt)
    fixed = learner.algo.graph.fixed_params
    assert fixed and all(n.startswith("cells.fixed.") for n in fixed)
    before = learner.params
    rng = np.random.default_rng(0)
    for _ in range(20):
        learner.step(rng.standard_normal(3).astype(np.float32), rng.standard_normal(2).astype(np.float32))
    after = learner.params
    for n in before:
        same = np.array_equal(np.asarray(before[n]), np.asarray(after[n]))
        assert same == (n in fixed), n
