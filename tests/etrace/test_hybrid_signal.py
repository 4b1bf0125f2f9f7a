"""The hybrid's learning signal: a model learning under an RLS readout with several ridges gets
the gradient of the best readout's error through the most regularised readout's weights.
Checked in float64 against a slow reference: the RLS written out in numpy from its equations,
and each step's gradient by jax.grad through the model's whole unrolled history (BPTT), which
exact RTRL must equal."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

import streamtrace as st
from models import gru_net
from streamtrace.etrace.model_fn import ModelFunction

T, DELTAS, WINDOW = 30, (0.1, 1e-8), 5


def numpy_rls(rs, ys):
    """Per step: the readouts' weights and errors before the step's update (the module doc's
    equations: k = P r / (1 + r'P r), W += k e', P -= k r'P; err: mean of e^2 over WINDOW)."""
    m, o = rs.shape[1], ys.shape[1]
    W = [np.zeros((m, o)) for _ in DELTAS]
    P = [np.eye(m) / d for d in DELTAS]
    err = np.zeros(len(DELTAS))
    before = []
    for r, y in zip(rs, ys):
        before.append(([w.copy() for w in W], err.copy()))
        for k in range(len(DELTAS)):
            e = y - r @ W[k]
            Pr = P[k] @ r
            gain = Pr / (1.0 + r @ Pr)
            W[k] = W[k] + np.outer(gain, e)
            P[k] = P[k] - np.outer(gain, Pr)
            err[k] = (1 - 1 / WINDOW) * err[k] + np.mean(e * e) / WINDOW
    return before


def test_the_gradient_under_the_readout_is_bptt_of_the_best_error_through_the_smoothest_readout(x64):
    rng = np.random.default_rng(5)
    xs = rng.normal(size=(T, 3))
    ys = xs @ rng.normal(size=(3, 2)) + 0.01 * rng.normal(size=(T, 2))   # the weak ridge fits it best
    learner = st.OnlineLearner(gru_net(n_in=3, n_hidden=4, n_out=2), xs[0], algorithm=st.rtrl(),
                               optimizer=optax.sgd(1.0), mode=st.Supervised(learn_every=T),
                               readout=st.rls(2, delta=DELTAS, select_window=WINDOW))
    p0 = learner.params
    preds = np.array([learner.step(x, y).prediction for x, y in zip(xs, ys)])
    delta = {k: learner.params[k] - p0[k] for k in p0}

    model = gru_net(n_in=3, n_hidden=4, n_out=2)       # the reference's own copy (same seed), unbatched
    f = ModelFunction(model)
    hidden = {k: jnp.zeros(np.shape(v)[-1:]) for k, v in f.hidden_values().items()}
    params = {k: jnp.asarray(v) for k, v in p0.items()}

    def features(p):
        """(T, m): every step's readout input [h_t, x_t, 1], the model unrolled over the stream."""
        def step(h, x):
            out, h = f(p, h, x)
            return h, jnp.concatenate([out, x, jnp.ones(1)])
        return jax.lax.scan(step, hidden, jnp.asarray(xs))[1]

    rs = np.asarray(jax.jit(features)(params))
    before = numpy_rls(rs, ys)
    smooth = DELTAS.index(max(DELTAS))
    best = np.array([r @ W[int(np.argmin(err))] for r, (W, err) in zip(rs, before)])
    # the value: the best readout's (rtol: the weak ridge starts at P = 1e8 I and amplifies rounding)
    np.testing.assert_allclose(preds, best, rtol=1e-6, atol=1e-9)
    assert sum(int(np.argmin(err)) != smooth for _, err in before) > T // 3, \
        "the weak ridge rarely predicted: the test could not tell the two readouts apart"
    g = 2.0 / ys.shape[1] * (best - ys)               # d mean((pred - y)^2) / d pred, per step
    Ws = np.array([W[smooth] for W, _ in before])     # (T, m, o): the held, most regularised weights
    # the sum of every step's gradient, each by BPTT through the history before it (weights fixed)
    total = jax.jit(jax.grad(lambda p: jnp.sum(g * jnp.einsum("tm,tmo->to", features(p), Ws))))(params)
    for k in delta:
        assert float(np.abs(total[k]).max()) > 1e-4, k
        np.testing.assert_allclose(delta[k], -total[k], rtol=1e-7, atol=1e-10, err_msg=k)
