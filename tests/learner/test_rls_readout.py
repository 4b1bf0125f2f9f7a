"""The RLS readout: equals batch (exponentially weighted) ridge least squares on a fixed hidden
sequence, predicts before it learns, keeps one readout per slot, ignores non-finite targets,
and (hybrid) hands the model the gradient of the readout's loss with its weights held."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

N_UNITS, T = 10, 60


def data(T=T, seed=0):
    rng = np.random.default_rng(seed)
    xs = rng.uniform(-1, 1, size=(T, 1))
    ys = np.stack([np.roll(xs[:, 0], 2) * 0.7 + 0.1, np.sin(3 * xs[:, 0])], axis=1)   # two targets
    return xs, ys


def features(params, xs):
    """numpy oracle of the readout input [h_t, x_t, 1] of a leak-1 reservoir."""
    W_in, b, W = (np.asarray(params[k], np.float64) for k in ("W_in", "b", "W"))
    h, rows = np.zeros(W.shape[0]), []
    for x in xs:
        h = np.tanh(x @ W_in + b + h @ W)
        rows.append(np.concatenate([h, x, [1.0]]))
    return np.array(rows)


def ridge(R, Y, delta, lam=1.0):
    """Exponentially weighted ridge: argmin sum_t lam^(T-1-t) |y_t - r_t W|^2 + lam^T delta |W|^2."""
    T = len(R)
    w = lam ** np.arange(T - 1, -1, -1, dtype=np.float64)
    A = R.T @ (w[:, None] * R) + lam ** T * delta * np.eye(R.shape[1])
    return np.linalg.solve(A, R.T @ (w[:, None] * Y))


def frozen_learner(lam=1.0, delta=1e-6, **kw):
    return st.OnlineLearner(nn.Reservoir(1, N_UNITS, seed=2, spectral_radius=0.8), np.zeros(1),
                            optimizer="frozen", readout=st.rls(2, lam=lam, delta=delta), **kw)


@pytest.mark.parametrize("lam", [1.0, 0.97])
def test_weights_equal_batch_ridge_least_squares(x64, lam):
    delta = 1e-6
    L = frozen_learner(lam=lam, delta=delta)
    xs, ys = data()
    R = features(L.params, xs)
    for t in range(T):
        L.step(xs[t], ys[t])
        if t in (R.shape[1] + 5, T - 1):
            W, want = L.state_dict()["readout.W"][0, 0], ridge(R[:t + 1], ys[:t + 1], delta, lam)
            # normwise: the reservoir's features are ill-conditioned, so a small
            # element of W carries the rounding of the large ones
            err = np.linalg.norm(W - want) / np.linalg.norm(want)
            assert err < 1e-7, (t, err)


def test_prediction_is_made_before_the_update(x64):
    """Step t predicts with the readout fitted on samples 0..t-1 (prequential), and reports
    the loss of that prediction."""
    delta = 1e-6
    L = frozen_learner(delta=delta)
    xs, ys = data()
    R = features(L.params, xs)
    for t in range(30):
        res = L.step(xs[t], ys[t])
        W_before = np.zeros((R.shape[1], 2)) if t == 0 else ridge(R[:t], ys[:t], delta)
        want = R[t] @ W_before
        np.testing.assert_allclose(res.prediction, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(res.loss[0], np.mean((want - ys[t]) ** 2), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-reservoir", "per-slot-reservoir"])
def test_per_slot_readouts_are_independent(x64, shared):
    """Two streams through a frozen reservoir (one shared, or one per slot); slot 1 is idle on
    some steps: each slot's readout and predictions equal those of a 1-slot learner fed only
    that slot's samples."""
    xs0, ys0 = data(seed=0)
    xs1, ys1 = data(seed=1)
    active = np.ones((T, 2), bool)
    active[[3, 4, 20, 41], 1] = False
    L = frozen_learner(delta=1e-4, slots=2, shared_weights=shared)
    solo = [frozen_learner(delta=1e-4), frozen_learner(delta=1e-4)]
    for t in range(T):
        res = L.step(np.stack([xs0[t], xs1[t]]), np.stack([ys0[t], ys1[t]]), active=active[t])
        for i, (xs, ys) in enumerate([(xs0, ys0), (xs1, ys1)]):
            if active[t, i]:
                one = solo[i].step(xs[t], ys[t])
                np.testing.assert_allclose(res.prediction[i], one.prediction, rtol=1e-9, atol=1e-12)
    s = L.state_dict()
    # per-slot weights keep each slot's 1-slot state under a leading slot axis
    slot = lambda key, i: s[key][i].reshape(s[key].shape[-2:])
    for i in range(2):
        np.testing.assert_allclose(slot("readout.W", i), solo[i].state_dict()["readout.W"][0, 0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(slot("readout.P", i), solo[i].state_dict()["readout.P"][0, 0], rtol=1e-9, atol=1e-12)
    # and slot 1's readout is the ridge solution on its own accepted samples
    R1 = features(solo[1].params, xs1[active[:, 1]])
    np.testing.assert_allclose(slot("readout.W", 1), ridge(R1, ys1[active[:, 1]], 1e-4), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_target_leaves_readout_unchanged(x64, bad):
    xs, ys = data()
    L, ref = frozen_learner(delta=1e-4), frozen_learner(delta=1e-4)
    for t in range(20):
        L.step(xs[t], ys[t])
        ref.step(xs[t], ys[t])
    before = L.state_dict()
    y = ys[20].copy()
    y[1] = bad
    res = L.step(xs[20], y)
    after = L.state_dict()
    for k in ("readout.W", "readout.P", "hidden.h"):
        assert np.array_equal(after[k], before[k]), k
    assert np.isnan(res.loss).all() and L.stats()["skipped"] == 1
    for t in range(21, 30):     # the refused step left nothing behind
        a, b = L.step(xs[t], ys[t]), ref.step(xs[t], ys[t])
        np.testing.assert_array_equal(a.prediction, b.prediction)


def test_hybrid_gradient_is_readout_loss_gradient_with_readout_held(x64):
    """optimizer=sgd under an RLS readout, W (recurrent) frozen by a parameter group: the first
    step's change of W_in and b is -lr * jax.grad of mse([h(W_in, b), x, 1] W_r, y) with the
    readout W_r held, computed here from scratch (at t=1 the traces are the immediate Jacobian)."""
    lr = 0.1
    groups = st.param_groups(rec=("W", None), rest=("*", optax.sgd(lr)))
    L = st.OnlineLearner(nn.Reservoir(2, 6, seed=4, leak=0.6), np.zeros(2), optimizer=groups,
                         readout=st.rls(2, delta=1e-2))
    rng = np.random.default_rng(5)
    s = L.state_dict()
    s["readout.W"] = rng.normal(size=s["readout.W"].shape)    # a readout that has learned something
    L.load_state_dict(s)
    p0 = L.params
    x, y = np.array([0.3, -0.8]), np.array([0.5, -0.2])
    W_r = s["readout.W"][0, 0]

    def loss(W_in, b):
        h = 0.6 * jnp.tanh(x @ W_in + b)        # h_0 = 0: leak * tanh(x W_in + b + 0 W)
        r = jnp.concatenate([h, x, jnp.ones(1)])
        return jnp.mean((r @ W_r - y) ** 2)
    g_in, g_b = jax.grad(loss, argnums=(0, 1))(jnp.asarray(p0["W_in"]), jnp.asarray(p0["b"]))
    assert np.abs(g_in).max() > 1e-3          # the check is not vacuous
    L.step(x, y)
    p1 = L.params
    np.testing.assert_allclose(p1["W_in"] - p0["W_in"], -lr * np.asarray(g_in), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(p1["b"] - p0["b"], -lr * np.asarray(g_b), rtol=1e-9, atol=1e-12)
    assert np.array_equal(p1["W"], p0["W"])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="lam"):
        st.rls(lam=0.0)
    with pytest.raises(ValueError, match="delta"):
        st.rls(delta=0.0)
    with pytest.raises(ValueError, match="n_out"):
        st.rls(n_out=0)
    with pytest.raises(ValueError, match="n_out"):    # supervised mode cannot guess the target size
        st.OnlineLearner(nn.Reservoir(1, 4), np.zeros(1, np.float32), readout=st.rls())


def test_hybrid_follows_numpy_rtrl_over_many_steps(x64):
    """Recurrent W set to 0 and frozen, leak 0.6: each unit is a leaky filter of its own input,
    where D-RTRL is exact RTRL. A numpy RTRL (traces e = (1-a) e + a (1-u^2) d(pre)/d(theta),
    gradient dL/dh * e with the readout held, sgd) follows the learner's W_in and b over many
    steps; the readout W before each step is read from the learner (RLS is checked above)."""
    lr, a, T_ = 0.05, 0.6, 25
    groups = st.param_groups(rec=("W", None), rest=("*", optax.sgd(lr)))
    L = st.OnlineLearner(nn.Reservoir(2, 6, seed=4, leak=a), np.zeros(2), optimizer=groups,
                         readout=st.rls(2, delta=1e-1))
    s = L.state_dict()
    s["params.rec.W"] = np.zeros_like(s["params.rec.W"])
    L.load_state_dict(s)
    rng = np.random.default_rng(8)
    xs, ys = rng.uniform(-1, 1, size=(T_, 2)), rng.uniform(-1, 1, size=(T_, 2))
    W_in, b = L.params["W_in"].copy(), L.params["b"].copy()
    h, e_in, e_b = np.zeros(6), np.zeros((2, 6)), np.zeros(6)
    for t in range(T_):
        W_r = L.state_dict()["readout.W"][0, 0]
        L.step(xs[t], ys[t])
        u = np.tanh(xs[t] @ W_in + b)
        h = (1 - a) * h + a * u
        e_in = (1 - a) * e_in + a * (1 - u ** 2)[None, :] * xs[t][:, None]
        e_b = (1 - a) * e_b + a * (1 - u ** 2)
        pred = np.concatenate([h, xs[t], [1.0]]) @ W_r
        dh = (2.0 / 2) * (W_r[:6] @ (pred - ys[t]))       # mse over 2 outputs, readout held
        W_in, b = W_in - lr * dh[None, :] * e_in, b - lr * dh * e_b
        np.testing.assert_allclose(L.params["W_in"], W_in, rtol=1e-9, atol=1e-12, err_msg=str(t))
        np.testing.assert_allclose(L.params["b"], b, rtol=1e-9, atol=1e-12, err_msg=str(t))
    assert np.abs(W_in - s["params.rest.W_in"]).max() > 1e-3     # it did learn
    np.testing.assert_array_equal(L.params["W"], 0.0)
