"""learner.adam: optax.adam's transform, whose guarded in-place step the learner applies. Its
results are checked against optax.adam's own update + apply_updates (the oracle), per value
where the gradient is not finite, and inside the learner against a twin running optax.adam."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

from models import CellNet


def _tree(rng, dtype):
    return {"W": jnp.asarray(rng.normal(size=(5, 7)), dtype), "b": jnp.asarray(rng.normal(size=(7,)), dtype)}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("hyper", [dict(learning_rate=1e-2), dict(learning_rate=3e-3, b1=0.8, b2=0.99, eps=1e-6,
                                                                   eps_root=1e-9)])
def test_guarded_step_equals_optax_adam(x64, dtype, hyper):
    rng = np.random.default_rng(0)
    ours, ref = st.adam(**hyper), optax.adam(**hyper)
    p_ours = p_ref = _tree(rng, dtype)
    s_ours, s_ref = ours.init(p_ours), ref.init(p_ref)
    assert jax.tree.structure(s_ours) == jax.tree.structure(s_ref)
    step = jax.jit(lambda g, s, p: ours.guarded_step(g, s, p, jnp.bool_(True)))
    for _ in range(25):
        g = _tree(rng, dtype)
        u, s_ref = ref.update(g, s_ref, p_ref)
        p_ref = optax.apply_updates(p_ref, u)
        p_ours, s_ours = step(g, s_ours, p_ours)
    tol = dict(rtol=2e-6, atol=1e-7) if dtype == "float32" else dict(rtol=1e-12, atol=1e-14)
    for a, b in zip(jax.tree.leaves((p_ours, s_ours)), jax.tree.leaves((p_ref, s_ref))):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **tol)
    assert int(s_ours[0].count) == 25


def test_values_with_a_non_finite_gradient_keep_weight_and_moments():
    """inf, NaN and a value whose square overflows float32 keep weight and both moments;
    every other value takes optax.adam's step (Adam is per value: the same as optax given
    zeros there), and the step counts."""
    rng = np.random.default_rng(1)
    opt = st.adam(1e-2)
    p = _tree(rng, "float32")
    s = opt.init(p)
    for _ in range(3):                                    # moments away from zero
        p, s = opt.guarded_step(_tree(rng, "float32"), s, p, jnp.bool_(True))
    g = _tree(rng, "float32")
    bad = [(0, 0), (1, 2), (4, 6)]
    W = np.asarray(g["W"]).copy()
    W[0, 0], W[1, 2], W[4, 6] = np.inf, np.nan, 1e20
    g_bad = {**g, "W": jnp.asarray(W)}
    p2, s2 = opt.guarded_step(g_bad, s, p, jnp.bool_(True))
    W0 = W.copy()
    for i, j in bad:
        W0[i, j] = 0.0
    u, s_ref = optax.adam(1e-2).update({**g, "W": jnp.asarray(W0)}, s, p)
    p_ref = optax.apply_updates(p, u)
    mask = np.zeros(W.shape, bool)
    for i, j in bad:
        mask[i, j] = True
    for new, old, ref in ((p2["W"], p["W"], p_ref["W"]), (s2[0].mu["W"], s[0].mu["W"], s_ref[0].mu["W"]),
                          (s2[0].nu["W"], s[0].nu["W"], s_ref[0].nu["W"])):
        new, old, ref = map(np.asarray, (new, old, ref))
        assert np.isfinite(new).all()
        assert np.array_equal(new[mask], old[mask])
        np.testing.assert_allclose(new[~mask], ref[~mask], rtol=2e-6, atol=1e-8)
        assert not np.allclose(new[~mask], old[~mask])    # the others did move
    np.testing.assert_allclose(np.asarray(p2["b"]), np.asarray(p_ref["b"]), rtol=2e-6, atol=1e-8)
    assert int(s2[0].count) == int(s[0].count) + 1


def test_a_refused_step_changes_nothing():
    rng = np.random.default_rng(2)
    opt = st.adam(1e-2)
    p = _tree(rng, "float32")
    s = opt.init(p)
    p, s = opt.guarded_step(_tree(rng, "float32"), s, p, jnp.bool_(True))
    p2, s2 = opt.guarded_step(_tree(rng, "float32"), s, p, jnp.bool_(False))
    for a, b in zip(jax.tree.leaves((p2, s2)), jax.tree.leaves((p, s))):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_a_schedule_gives_plain_optax_adam():
    opt = st.adam(optax.linear_schedule(1e-2, 1e-3, 100))
    assert not hasattr(opt, "guarded_step")
    p = {"w": jnp.ones(3)}
    u, _ = opt.update({"w": jnp.ones(3)}, opt.init(p), p)
    assert np.all(np.asarray(u["w"]) < 0)


@pytest.mark.parametrize("slots", [None, 3])
def test_learner_default_adam_learns_as_optax_adam(slots):
    """The default optimizer (in place, donated buffers) against a twin with optax.adam (the
    per-leaf guard, buffers kept): the same predictions and weights over 150 steps."""
    def make(**kw):
        model = CellNet(nn.GRUCell, n_in=3, n_hidden=8, n_out=2, seed=0)
        return st.OnlineLearner(model, np.zeros(3, np.float32), lr=1e-2, slots=slots, **kw)
    ours, twin = make(), make(optimizer=optax.adam(1e-2), donate=False)
    assert hasattr(ours.fns.opt, "guarded_step") and ours.donate
    rng = np.random.default_rng(3)
    lead = (150,) if slots is None else (150, slots)
    xs = rng.normal(size=lead + (3,)).astype(np.float32)
    ys = np.tanh(np.cumsum(xs[..., :2], axis=0) * 0.3).astype(np.float32)
    for x, y in zip(xs, ys):
        a, b = ours.step(x, y), twin.step(x, y)
        np.testing.assert_allclose(a.prediction, b.prediction, rtol=1e-4, atol=1e-5)
    assert ours.stats()["updates"] == twin.stats()["updates"] == 150
    for k, v in ours.params.items():
        np.testing.assert_allclose(np.asarray(v), np.asarray(twin.params[k]), rtol=1e-4, atol=1e-5)


def test_a_donating_learner_gives_up_its_standalone_buffers_only():
    """With donation the weights, moments and traces (standalone buffers) are given to XLA and
    the packed small state is not; a step still reads and writes both correctly (above)."""
    model = CellNet(nn.GRUCell, n_in=3, n_hidden=64, n_out=1, seed=0)
    L = st.OnlineLearner(model, np.zeros(3, np.float32))
    n = len(L.layout.dtypes)
    assert L.donate and len(L.buffers) > n                 # some standalone buffers
    old = L.buffers
    L.step(np.ones(3, np.float32), np.ones(1, np.float32))
    assert not any(b.is_deleted() for b in old[:n])
    assert all(b.is_deleted() for b in old[n:])
    plain = st.OnlineLearner(model, np.zeros(3, np.float32), optimizer=optax.adam(1e-3))
    assert not plain.donate                                # optax: kept, see OnlineLearner
    assert "input_output_alias" in L.programs.step().as_text()  # still the compiled program's text
