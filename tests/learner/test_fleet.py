"""Fleet learning: many streams, one set of trace-learned weights, each stream its own hidden
state and traces. The shared update must be the sum of what each stream alone would ask for
(float64): against exact BPTT over every stream's unrolled history (exact RTRL), and against
one learner per stream (D-RTRL, the algorithm fleets run)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

import streamtrace as st
from models import gru_net, make, mse, CellNet
from streamtrace.etrace.model_fn import ModelFunction

STREAMS, T = 4, 8


def data(seed=3):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(T, STREAMS, 3)), rng.normal(size=(T, STREAMS, 2))


def fleet_update(algorithm, xs, ys, slots):
    """The weight change of one learner after T steps whose gradients are summed (learn_every=T)
    and applied once by SGD with step 1: minus the summed gradient."""
    learner = st.OnlineLearner(gru_net(), xs[0, 0], algorithm=algorithm, optimizer=optax.sgd(1.0),
                               mode=st.Supervised(learn_every=T),
                               slots=st.Slots(slots, shared=True, reduce="sum") if slots else None)
    before = learner.params
    for t in range(T):
        r = learner.step(xs[t] if slots else xs[t, 0], ys[t] if slots else ys[t, 0])
    assert np.all(r.applied), "the summed update must apply at step T"
    after = learner.params
    return before, {k: after[k] - before[k] for k in before}


def test_shared_update_is_the_sum_of_every_streams_bptt_gradient(x64):
    xs, ys = data()
    before, delta = fleet_update("rtrl", xs, ys, STREAMS)
    model = make(CellNet(st.nn.GRUCell), batch=STREAMS)      # the oracle's own copy, same seed
    f = ModelFunction(model)
    hidden = st.etrace.D_RTRL(model, jnp.asarray(xs[0])).graph.init_hidden()      # zeros, batched per stream

    def total(p):
        h, loss = hidden, 0.0
        for t in range(T):
            out, h = f(p, h, jnp.asarray(xs[t]))
            loss = loss + sum(mse(out[i], ys[t, i]) / 2 for i in range(STREAMS))   # mean over 2 outputs
        return loss
    oracle = jax.jit(jax.grad(total))({k: jnp.asarray(v) for k, v in before.items()})
    assert set(oracle) == set(delta)
    for k in delta:
        assert float(np.abs(oracle[k]).max()) > 1e-3, f"{k}: the oracle gradient vanished"
        np.testing.assert_allclose(delta[k], -np.asarray(oracle[k]), rtol=1e-9, atol=1e-12, err_msg=k)


def test_shared_update_is_the_sum_of_each_stream_learning_alone(x64):
    """D-RTRL (what a fleet runs): the fleet's update against each stream's own, that stream alone
    active in the same learner restored to the start between runs (traces differ per stream)."""
    xs, ys = data(seed=4)
    learner = st.OnlineLearner(gru_net(), xs[0, 0], algorithm=st.d_rtrl(), optimizer=optax.sgd(1.0),
                               mode=st.Supervised(learn_every=T), slots=st.Slots(STREAMS, shared=True, reduce="sum"))
    start, before = learner.state_dict(), learner.params

    def update(active):
        learner.load_state_dict(start)
        for t in range(T):
            learner.step(xs[t], ys[t], active=active)
        return {k: learner.params[k] - before[k] for k in before}
    shared = update(np.ones(STREAMS, bool))
    alone = [update(np.arange(STREAMS) == i) for i in range(STREAMS)]
    for k in shared:
        summed = sum(a[k] for a in alone)
        assert float(np.abs(summed).max()) > 1e-3 and float(np.abs(summed - alone[0][k]).max()) > 1e-3, k
        np.testing.assert_allclose(shared[k], summed, rtol=1e-9, atol=1e-12, err_msg=k)
