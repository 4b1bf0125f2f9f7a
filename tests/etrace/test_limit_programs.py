"""The limit programs of bench/limits.py compute what the learner computes: the yardstick the
benchmark divides by must be the same math. float64, a small GRU, a few steps."""
from paths import ROOT
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import streamtrace as st

sys.path.insert(0, str(ROOT / "bench"))
import limits  # noqa: E402

N_IN, H, N_OUT, LR, STEPS = 3, 5, 2, 1e-2, 4


CASES = [(a, s, "optax") for a in ("d-rtrl", "es-d-rtrl") for s in (None, 3)] + [("d-rtrl", 3, "fused")]


def run_against_limit(learner, algorithm, slots, adam="optax"):
    """Steps ``learner`` (a GRU Stack(N_IN, H, N_OUT), Adam(LR)) and the limit program on the
    same random data; every prediction and the final weights must agree (float64). Returns
    the learner's weights before and after."""
    p0 = learner.params
    assert sorted(p0) == sorted(limits.GRU_PARAMS)
    n = slots or 1
    fn = jax.jit(limits.make_limit_fn(N_IN, algorithm, lr=LR, adam=adam))
    state = limits.init_limit_state(p0, n, algorithm, lr=LR, adam=adam)
    rng = np.random.default_rng(0)
    for _ in range(STEPS):
        x, y = rng.normal(size=(n, N_IN)), rng.normal(size=(n, N_OUT))
        # the learner predicts before it learns: its prediction is the limit's output
        res = learner.step(x if slots else x[0], y if slots else y[0])
        state, out = fn(state, x, y)
        np.testing.assert_allclose(res.prediction.reshape(n, N_OUT), out, rtol=1e-10, atol=1e-12)
    p1 = learner.params
    got = limits.from_limit_weights(state[0])
    for k in limits.GRU_PARAMS:
        np.testing.assert_allclose(np.asarray(got[k]), p1[k], rtol=1e-9, atol=1e-12, err_msg=k)
    return p0, p1


@pytest.mark.parametrize("algorithm,slots,adam", CASES, ids=[f"{a}-{s or 1}slot-{o}" for a, s, o in CASES])
def test_limit_matches_learner(x64, algorithm, slots, adam):
    learner = st.OnlineLearner(st.nn.Stack("gru", N_IN, H, N_OUT, seed=1), np.zeros(N_IN),
                               algorithm=algorithm, optimizer=optax.adam(LR), slots=slots)
    p0, p1 = run_against_limit(learner, algorithm, slots, adam)
    moved = max(float(np.max(np.abs(p1[k] - p0[k]))) for k in limits.GRU_PARAMS)
    assert moved > 1e-3  # the weights really moved (Adam steps of ~lr)


def test_fused_adam_equals_optax(x64):
    rng = np.random.default_rng(1)
    params = (rng.normal(size=(4, 3)), rng.normal(size=7))
    init, update = limits.fused_adam(1e-2)
    opt = optax.adam(1e-2)
    s_f, s_o, p_f, p_o = init(params), opt.init(params), params, params
    for _ in range(5):
        g = (rng.normal(size=(4, 3)), rng.normal(size=7))
        p_f, s_f = update(g, s_f, p_f)
        u, s_o = opt.update(g, s_o, p_o)
        p_o = optax.apply_updates(p_o, u)
    for a, b in zip(p_f, p_o):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
