"""Delayed labels (``Supervised(label_delay=d)``, learner/labels.py) against an independent
float64 reference: a loop written here that keeps, per step, the step's own inputs (weights,
hidden state, traces, x) and, when the label arrives, takes ``jax.grad`` of the MSE through
that one step (the custom VJP: the gradient through the step-t traces) and applies it with
SGD to the weights as they are then. Also: bad labels change nothing, the ring's memory
formula, checkpoints, and a delayed-label task that still learns.
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn
from streamtrace.learner.labels import LabelError, ring_bytes

from models import CellNet

N_IN, N_HID, N_OUT, LR = 3, 5, 2, 0.1


def gru(seed=0):
    return CellNet(nn.GRUCell, n_in=N_IN, n_hidden=N_HID, n_out=N_OUT, seed=seed)


def data(steps, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(steps, N_IN)), rng.normal(size=(steps, N_OUT))


def schedule(steps, d, seed=1):
    """{arrival step s: [t, ...]}: the label of step t comes after step t + a (a < d, random),
    or never (one in five)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in range(steps):
        if d and rng.random() < 0.2:
            continue
        a = int(rng.integers(0, d)) if d else 0
        out.setdefault(t + a, []).append(t)
    return out


def reference(runs, make_algo=st.etrace.D_RTRL):
    """The rule, offline, for streams (xs, ys, arrivals) sharing one set of weights: per step,
    each stream predicts with the current weights; when the label of a stream's step t
    arrives, the gradient of mse(out_t, y_t) through that one step (its weights, hidden state
    and traces) is applied with SGD. Returns (final weights, each stream's predictions)."""
    model = gru()
    brainstate.nn.init_all_states(model, None)
    algo = make_algo(model, jnp.asarray(runs[0][0][0]))
    params, hidden, traces = algo.init_state()
    carried = [(hidden, traces)] * len(runs)

    def loss(p, h, tr, x, y):
        return jnp.mean((algo(p, h, tr, x)[0] - y) ** 2)
    grad = jax.jit(jax.grad(loss))
    forward = jax.jit(lambda p, h, tr, x: algo(p, h, tr, x))
    kept, preds = {}, [[] for _ in runs]
    for s in range(len(runs[0][0])):
        for k, (xs, _, _) in enumerate(runs):
            kept[k, s] = (params, *carried[k], jnp.asarray(xs[s]))
            out, *carried[k] = forward(params, *carried[k], jnp.asarray(xs[s]))
            preds[k].append(np.asarray(out))
        for k, (_, ys, arrivals) in enumerate(runs):
            for t in arrivals.get(s, []):
                g = grad(*kept[k, t], jnp.asarray(ys[t]))
                params = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, g)
    return {k: np.asarray(v) for k, v in params.items()}, [np.stack(p) for p in preds]


def delayed(d, **kw):
    return st.OnlineLearner(gru(), np.zeros(N_IN), optimizer=optax.sgd(LR), mode=st.Supervised(label_delay=d), **kw)


@pytest.mark.parametrize("d", [0, 1, 5, 20])
def test_delayed_labels_equal_the_offline_rule(x64, d):
    steps = 40
    xs, ys = data(steps)
    arrivals = schedule(steps, d)
    learner = delayed(d)
    start = learner.params
    preds = []
    for s in range(steps):
        if d == 0:       # no delay: the label comes with its x, as in every supervised learner
            preds.append(learner.step(xs[s], ys[s]).prediction)
            continue
        preds.append(learner.step(xs[s]).prediction)
        for t in arrivals.get(s, []):
            assert learner.label(ys[t], age=s - t).applied
    want, (want_preds,) = reference([(xs, ys, arrivals)])
    got = learner.params
    assert max(np.abs(got[k] - want[k]).max() for k in want) < 1e-11
    assert max(np.abs(got[k] - start[k]).max() for k in want) > 1e-2   # it learned
    np.testing.assert_allclose(np.stack(preds), want_preds, rtol=0, atol=1e-11)
    assert learner.stats()["updates"] == sum(len(ts) for s, ts in arrivals.items() if s < steps)


@pytest.mark.parametrize("shared", [False, True])
def test_slots_follow_the_offline_rule(x64, shared):
    """Two slots, a model each or one shared (ES-D-RTRL this time), their labels on schedules
    of their own."""
    steps, d = 24, 5
    runs = [(*data(steps, seed=10 + k), schedule(steps, d, seed=20 + k)) for k in range(2)]
    learner = st.OnlineLearner(gru(), np.zeros(N_IN), algorithm=st.es_d_rtrl(decay=0.8), optimizer=optax.sgd(LR),
                               mode=st.Supervised(label_delay=d), slots=st.Slots(2, shared=shared))
    for s in range(steps):
        learner.step(np.stack([runs[0][0][s], runs[1][0][s]]))
        for k, (_, ys, arrivals) in enumerate(runs):
            for t in arrivals.get(s, []):
                learner.label(ys[t], age=s - t, slot=k)
    got, es = learner.params, lambda m, x: st.etrace.ES_D_RTRL(m, x, decay=0.8)
    if shared:
        want, _ = reference(runs, es)
        assert max(np.abs(got[n] - want[n]).max() for n in want) < 1e-11
    for k in range(0 if shared else 2):
        want, _ = reference([runs[k]], es)
        assert max(np.abs(got[n][k] - want[n]).max() for n in want) < 1e-11, k
    with pytest.raises(ValueError, match="label"):
        learner.step(np.zeros((2, N_IN)), np.zeros((2, N_OUT)))


def test_label_delay_0_is_the_supervised_learner_bit_for_bit(x64):
    xs, ys = data(20, seed=3)
    a = st.OnlineLearner(gru(), xs[0], optimizer=optax.sgd(LR), mode=st.Supervised(label_delay=0))
    b = st.OnlineLearner(gru(), xs[0], optimizer=optax.sgd(LR), mode="supervised")
    assert a.signature() == b.signature()
    for t in range(20):
        ra, rb = a.step(xs[t], ys[t]), b.step(xs[t], ys[t])
        assert np.array_equal(ra.prediction, rb.prediction) and np.array_equal(ra.loss, rb.loss)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)


def test_a_label_at_once_equals_the_supervised_step(x64):
    """The ring's contraction (sum_o dL/dout[o] * grad[o]) against the plain step's gradient:
    equal to rounding (a product in another order), not bit for bit."""
    xs, ys = data(30, seed=4)
    a, b = delayed(3), st.OnlineLearner(gru(), xs[0], optimizer=optax.sgd(LR))
    for t in range(30):
        pa = a.step(xs[t]).prediction
        a.label(ys[t])
        np.testing.assert_allclose(pa, b.step(xs[t], ys[t]).prediction, rtol=0, atol=1e-12)
    for k, v in b.params.items():
        np.testing.assert_allclose(a.params[k], v, rtol=0, atol=1e-12)


def _same(before, after):
    return before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("slots", [None, 2, "per-slot"])
def test_bad_labels_get_their_code_and_change_nothing(x64, slots):
    d = 6
    kw = {} if slots is None else {"slots": st.Slots(2, shared=slots != "per-slot")}
    learner = delayed(d, **kw)
    n = 1 if slots is None else 2
    xs, ys = data(4, seed=5)
    lead = (lambda v: v) if slots is None else (lambda v: np.stack([v] * n))
    slot = None if slots is None else 1
    for t in range(4):          # the labelled slot does not learn at step 2
        learner.step(lead(xs[t]), learn=np.arange(n) != n - 1 if t == 2 else None)
    learner.label(ys[0], age=3, slot=slot)                   # a good one, before the fuzz
    y = ys[1]
    bad = [(dict(y=y, age=4), "unknown_label"),              # before the slot's first step
           (dict(y=y, age=1), "unknown_label"),              # a step that did not learn
           (dict(y=y, age=3), "already_labelled"),
           (dict(y=y, age=d), "label_too_late"),
           (dict(y=y, age=d + 7), "label_too_late"),
           (dict(y=y, age=-1), "unknown_label"),
           (dict(y=np.zeros(N_OUT + 1), age=0), "bad_shape"),
           (dict(y=np.zeros((1, N_OUT)), age=0), "bad_shape"),
           (dict(y=np.array([np.nan, 0.0]), age=0), "not_finite"),
           (dict(y=np.array([0.0, np.inf]), age=0), "not_finite")]
    for kwargs, code in bad:
        before = learner.state_dict()
        with pytest.raises(LabelError) as err:
            learner.label(slot=slot, **kwargs)
        assert err.value.code == code, (kwargs, err.value)
        assert _same(before, learner.state_dict()), kwargs
    # the compiled guard itself (past the Python checks): refused, the buffers the same bits
    program = learner.programs.label()
    i = np.int32(0 if slot is None else slot)
    for age, y, status in [(d, ys[1], 2), (0, np.array([np.nan, 0.0]), 4), (3, ys[1], 3), (1, ys[1], 1)]:
        before = learner.state_dict()
        learner.buffers, got, loss, applied = program(learner.buffers, i, np.int32(age), y)
        assert int(got) == status and not bool(applied) and np.isnan(float(loss))
        assert _same(before, learner.state_dict())
    before = learner.state_dict()
    assert learner.label(ys[3], age=0, slot=slot).applied     # a good label still applies
    assert not _same(before, learner.state_dict())
    with pytest.raises(ValueError, match="label_delay"):
        st.OnlineLearner(gru(), np.zeros(N_IN), optimizer=optax.sgd(LR)).label(ys[0])


def test_ring_memory_is_the_documented_formula(x64):
    d = 7
    for slots in (None, st.Slots(3), st.Slots(4, shared=False)):
        learner = delayed(d, **({} if slots is None else {"slots": slots}))
        n_params = sum(v[0].size if slots is not None and not slots.shared else v.size
                       for v in learner.params.values())
        ring = sum(int(np.prod(shape)) * np.dtype(dt).itemsize
                   for name, shape, dt in learner.layout.entries() if name.startswith("labels."))
        assert ring == learner.n * ring_bytes(d, N_OUT, n_params, 8), (slots, ring)
        assert n_params == 3 * (N_IN + N_HID) * N_HID + 3 * N_HID + N_HID * N_OUT + N_OUT


def test_checkpoint_holds_the_ring_and_resumes_bit_identically(x64, tmp_path):
    xs, ys = data(12, seed=6)
    a = delayed(5, slots=st.Slots(2, shared=False))
    pair = lambda t: np.stack([xs[t], xs[t][::-1]])
    for t in range(6):
        a.step(pair(t))
    a.label(ys[3], age=2, slot=0)
    a.save(tmp_path / "c.ckpt")
    b = delayed(5, slots=st.Slots(2, shared=False))
    b.restore(tmp_path / "c.ckpt")
    for learner in (a, b):
        learner.label(ys[4], age=1, slot=1)        # labels of steps before the checkpoint
        learner.label(ys[2], age=3, slot=0)
        for t in range(6, 12):
            learner.step(pair(t))
            learner.label(ys[t], slot=t % 2)
    assert _same(a.state_dict(), b.state_dict())
    with pytest.raises(LabelError) as err:
        b.label(ys[3], age=10 - 3 + 0, slot=0)
    assert err.value.code == "label_too_late"


def test_configurations_a_ring_cannot_serve_are_refused(x64):
    with pytest.raises(ValueError, match="label_delay"):
        st.OnlineLearner(gru(), np.zeros(N_IN), mode=st.Supervised(label_delay=2), optimizer=st.frozen())
    with pytest.raises(ValueError, match="label_delay"):
        st.OnlineLearner(gru(), np.zeros(N_IN), mode=st.Supervised(label_delay=2), transform=st.normalise())
    with pytest.raises(ValueError, match="label_delay"):
        st.Supervised(label_delay=2, learn_every=3)
    with pytest.raises(ValueError, match="label_delay"):
        st.Supervised(label_delay=-1)


def test_a_delayed_label_task_still_learns():
    """Target: a low-pass filtered input, each label 10 steps late (label_delay 12)."""
    steps, late = 2000, 10
    rng = np.random.default_rng(7)
    t = np.arange(steps)
    x = (np.sin(0.07 * t) + 0.5 * np.sin(0.19 * t + 1) + 0.1 * rng.normal(size=steps)).astype(np.float32)
    y = np.zeros(steps, np.float32)
    for i in range(1, steps):
        y[i] = 0.8 * y[i - 1] + 0.5 * x[i]
    model = CellNet(nn.GRUCell, n_in=1, n_hidden=16, n_out=1, seed=0)
    learner = st.OnlineLearner(model, np.zeros(1, np.float32), optimizer=st.adam(3e-3),
                               mode=st.Supervised(label_delay=12))
    err = np.zeros(steps)
    for i in range(steps):
        err[i] = (learner.step(x[i:i + 1]).prediction[0] - y[i]) ** 2
        if i >= late:
            learner.label(y[i - late:i - late + 1], age=late)
    early, final = err[:200].mean(), err[-400:].mean()
    assert final < 0.3 * early, (early, final)
    assert learner.stats()["updates"] == steps - late
