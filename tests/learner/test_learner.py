"""OnlineLearner: the compiled, packed step against slow step-by-step references.

* equivalence: weights and predictions after many supervised steps equal a loop written
  here with ``jax.grad`` through the core algorithm and the same optax optimizer (D-RTRL,
  ES-D-RTRL, RTRL; GRU and LIF; adam, sgd, clipping; learn_every=k: k summed gradients,
  one update);
* micro-batching: ``step_many`` (a scan) equals the same number of ``step`` calls;
* slots: per-slot weights equal independent single-stream learners, shared weights equal a
  batched model, ``reset_slot`` touches only its slot, masked slots (active=False) stay
  frozen and do not reach the weights, learn=False slots advance without learning;
* modes and input checks.

float64 throughout where numbers are compared (request the ``x64`` fixture and build the
models inside the test: ``import brainstate`` resets jax's x64 flag).
"""
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

from models import CellNet, Stack

N_IN, N_HID, N_OUT = 3, 6, 2


# ---- models and data ------------------------------------------------------------------------
def gru(seed=0, n_in=N_IN, n_out=N_OUT):
    return CellNet(nn.GRUCell, n_in=n_in, n_hidden=N_HID, n_out=n_out, seed=seed)


def lif(seed=0, n_in=N_IN, n_out=N_OUT):
    return Stack(lambda n: nn.LIF(n, tau=5.0), n_in=n_in, n_hidden=N_HID, n_out=n_out, gain=3.0, seed=seed)


MODELS = {"gru": gru, "lif": lif}


def data(steps, lead=(), n_in=N_IN, n_out=N_OUT, seed=1):
    """Inputs and targets in float64 (the targets hold float32 values: exact in either dtype)."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=np.float64).reshape((steps,) + (1,) * (len(lead) + 1))
    phase = rng.uniform(0, 2 * np.pi, lead + (1,))
    xs = np.sin(0.3 * t + phase + np.arange(n_in)) + 0.3 * rng.standard_normal((steps,) + lead + (n_in,))
    ys = 0.8 * np.sin(0.3 * t - 1.0 + phase + np.arange(n_out))
    return xs.astype(np.float64), ys.astype(np.float32)


def named_params(learner):
    return {k: np.array(v) for k, v in learner.params.items()}


def assert_params_close(got, want, rtol=1e-6, atol=1e-10):
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], np.asarray(want[name]), rtol=rtol, atol=atol, err_msg=name)


def assert_moved(now, before, at_least=1e-3):
    """The weights really learned (a no-op learner must not pass the comparisons)."""
    moved = max(float(np.max(np.abs(now[k] - np.asarray(before[k])))) for k in before)
    assert moved > at_least, moved


# ---- the slow reference -----------------------------------------------------------------------
def reference_run(model, make_algo, optimizer, xs, ys, learn_every=1):
    """Step by step with jax.grad through the core algorithm: per step the online gradient
    of mse(out, y); every ``learn_every`` steps one optimizer update with the summed
    gradients. Returns (initial params, final params, outputs per step, the global norm of
    every applied gradient)."""
    brainstate.nn.init_all_states(model, None)
    algo = make_algo(model, jnp.asarray(xs[0]))
    params, hidden, traces = algo.init_state()
    p0 = {k: np.array(v) for k, v in params.items()}

    def loss(p, h, tr, x, y):
        out, h, tr = algo(p, h, tr, x)
        return jnp.mean((out - y) ** 2), (out, h, tr)

    grad_fn = jax.jit(jax.grad(loss, has_aux=True))

    @jax.jit
    def update(g, opt_state, p):
        updates, opt_state = optimizer.update(g, opt_state, p)
        return optax.apply_updates(p, updates), opt_state

    opt_state = optimizer.init(params)
    acc = None
    outs, norms = [], []
    for t in range(len(xs)):
        g, (out, hidden, traces) = grad_fn(params, hidden, traces, jnp.asarray(xs[t]), jnp.asarray(ys[t]))
        outs.append(np.asarray(out))
        acc = g if acc is None else jax.tree_util.tree_map(jnp.add, acc, g)
        if (t + 1) % learn_every == 0:
            norms.append(np.sqrt(sum(np.sum(np.asarray(v) ** 2) for v in acc.values())))
            params, opt_state = update(acc, opt_state, params)
            acc = None
    return p0, {k: np.asarray(v) for k, v in params.items()}, np.stack(outs), np.array(norms)


# ---- 1. equivalence with the reference ----------------------------------------------------------
CASES = [
    pytest.param("gru", "d-rtrl", lambda: optax.adam(1e-2), None, id="gru-d_rtrl-adam"),
    pytest.param("gru", "es-d-rtrl", lambda: optax.sgd(0.1), None, id="gru-es_d_rtrl-sgd"),
    pytest.param("lif", "d-rtrl", lambda: optax.adam(1e-2), None, id="lif-d_rtrl-adam"),
    pytest.param("lif", "es-d-rtrl", lambda: optax.sgd(0.1), None, id="lif-es_d_rtrl-sgd"),
    pytest.param("gru", "rtrl", lambda: optax.sgd(0.1), None, id="gru-rtrl-sgd"),
    pytest.param("gru", "d-rtrl", lambda: optax.sgd(0.1), 0.05, id="gru-d_rtrl-sgd-clip"),
]
REF_ALGO = {"d-rtrl": lambda m, x: st.etrace.D_RTRL(m, x),
            "es-d-rtrl": lambda m, x: st.etrace.ES_D_RTRL(m, x, decay=0.8),
            "rtrl": lambda m, x: st.etrace.RTRL(m, x)}


@pytest.mark.parametrize("model_name,algorithm,make_opt,clip", CASES)
def test_learner_equals_reference_loop(x64, model_name, algorithm, make_opt, clip):
    steps = 200
    xs, ys = data(steps)
    build = MODELS[model_name]
    decay = 0.8 if algorithm == "es-d-rtrl" else None
    learner = st.OnlineLearner(build(seed=0), xs[0], algorithm=algorithm, decay=decay, optimizer=make_opt(),
                               clip=clip)
    start = named_params(learner)
    preds = np.stack([learner.step(xs[t], ys[t]).prediction for t in range(steps)])

    # the learner clips the global norm over all weights before its optimizer
    ref_opt = make_opt() if clip is None else optax.chain(optax.clip_by_global_norm(clip), make_opt())
    p0, ref, ref_outs, norms = reference_run(build(seed=0), REF_ALGO[algorithm], ref_opt, xs, ys)
    if clip is not None:
        assert np.mean(norms > clip) > 0.2      # the clipping is really at work
    # both models are built with the same keys: identical starting weights
    assert set(start) == set(p0)
    for name in p0:
        np.testing.assert_array_equal(start[name], p0[name], err_msg=name)
    assert_moved(ref, p0)
    assert_params_close(named_params(learner), ref)
    assert preds.dtype == np.float64          # predictions keep the model's dtype
    np.testing.assert_allclose(preds, ref_outs, rtol=1e-6, atol=1e-10)
    assert learner.stats()["updates"] == steps


def test_different_keys_give_different_models(x64):
    """The comparisons above rely on the keys: another seed is another model."""
    def params(seed):
        model = gru(seed=seed)
        brainstate.nn.init_all_states(model, None)
        return st.etrace.D_RTRL(model, jnp.zeros(N_IN)).init_state()[0]
    a, b, c = params(0), params(0), params(1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["cell.z.W"], c["cell.z.W"])


@pytest.mark.parametrize("model_name,algorithm,make_opt,clip", [CASES[0], CASES[3]])
def test_learn_every_k_sums_gradients(x64, model_name, algorithm, make_opt, clip):
    steps, k = 200, 4
    xs, ys = data(steps, seed=2)
    build = MODELS[model_name]
    decay = 0.8 if algorithm == "es-d-rtrl" else None
    learner = st.OnlineLearner(build(seed=0), xs[0], algorithm=algorithm, decay=decay, optimizer=make_opt(),
                               learn_every=k)
    before = named_params(learner)
    applied = []
    for t in range(steps):
        r = learner.step(xs[t], ys[t])
        applied.append(r.applied)
        now = named_params(learner)
        changed = any(not np.array_equal(now[n], before[n]) for n in now)
        assert changed == r.applied, t      # weights move exactly on the update steps
        before = now
    assert applied == [(t + 1) % k == 0 for t in range(steps)]
    assert learner.stats()["updates"] == steps // k

    p0, ref, _, _ = reference_run(build(seed=0), REF_ALGO[algorithm], make_opt(), xs, ys, learn_every=k)
    assert_moved(ref, p0)
    assert_params_close(named_params(learner), ref)
    # and it is not the same as updating every step
    _, ref1, _, _ = reference_run(build(seed=0), REF_ALGO[algorithm], make_opt(), xs, ys, learn_every=1)
    assert not all(np.allclose(ref1[n], ref[n], rtol=1e-6, atol=1e-10) for n in ref)


# ---- 2. micro-batching --------------------------------------------------------------------------
@pytest.mark.parametrize("slots,learn_every", [(None, 1), (3, 3)], ids=["single", "slots3-every3"])
def test_step_many_equals_single_steps(x64, slots, learn_every):
    """Two rounds of k=8 through step_many against 16 step calls from the same start
    (with learn_every=3 the optimizer updates fall inside and across the rounds)."""
    k, rounds = 8, 2
    lead = () if slots is None else (slots,)
    xs, ys = data(k * rounds, lead=lead, seed=3)
    learner = st.OnlineLearner(gru(seed=0), np.zeros(N_IN), algorithm="d-rtrl", optimizer=optax.adam(1e-2),
                               slots=slots, learn_every=learn_every)
    init = learner.state_dict()
    # with slots: some slots sit out some steps (active), others only predict (learn)
    active = learn = None
    if slots is not None:
        rng = np.random.default_rng(0)
        active, learn = rng.random((2, k * rounds, slots)) > 0.25
        assert not active.all() and not learn.all()
    mask = lambda m, t: None if m is None else m[t]
    singles = [learner.step(xs[t], ys[t], active=mask(active, t), learn=mask(learn, t)) for t in range(k * rounds)]
    want_state, want_stats = learner.state_dict(), learner.stats()
    assert_moved(named_params(learner), {n[len("params."):]: v for n, v in init.items() if n.startswith("params.")})

    learner.load_state_dict(init)
    batch = []
    for r0 in range(0, k * rounds, k):
        part = lambda m: None if m is None else m[r0:r0 + k]
        got = learner.step_many(xs[r0:r0 + k], ys[r0:r0 + k], active=part(active), learn=part(learn))
        assert len(got) == k
        batch += got
    for t, (a, b) in enumerate(zip(singles, batch)):
        np.testing.assert_allclose(b.prediction, a.prediction, rtol=1e-12, atol=1e-14, err_msg=str(t))
        np.testing.assert_allclose(b.loss, a.loss, rtol=1e-12, atol=1e-14, err_msg=str(t))
        assert np.array_equal(np.asarray(b.applied), np.asarray(a.applied)), t
    if slots is None:
        assert sum(r.applied for r in singles) == k * rounds // learn_every
    assert sum(np.any(r.applied) for r in singles) >= 3
    got_state = learner.state_dict()
    assert set(got_state) == set(want_state)
    for name in want_state:
        np.testing.assert_allclose(got_state[name], want_state[name], rtol=1e-12, atol=1e-14, err_msg=name)
    got_stats = learner.stats()
    np.testing.assert_allclose(got_stats.pop("prequential_loss"), want_stats.pop("prequential_loss"), rtol=1e-6)
    got_m, want_m = got_stats.pop("metrics"), want_stats.pop("metrics")
    for key in want_m:
        np.testing.assert_allclose(got_m[key], want_m[key], rtol=1e-9, err_msg=key)
    assert got_stats == want_stats
    assert got_stats["step"] == k * rounds


# ---- 3. slots -----------------------------------------------------------------------------------
def slot_rows(name, value, per_slot):
    """Whether a state_dict entry carries a leading slot axis."""
    return per_slot or name.startswith(("hidden.", "traces.", "pending.", "stats.preq", "stats.roll", "signal.", "readout."))


def test_per_slot_weights_equal_independent_learners(x64):
    n, steps = 16, 20
    xs, ys = data(steps, lead=(n,), seed=4)
    multi = st.OnlineLearner(gru(seed=0), xs[0, 0], optimizer=optax.adam(1e-2), slots=n, shared_weights=False)
    preds = np.stack([multi.step(xs[t], ys[t]).prediction for t in range(steps)])
    assert preds.shape == (steps, n, N_OUT)
    # one single-stream learner, restarted from its initial state for every slot's stream:
    # the same as n independent learners (they would all start from the same weights)
    single = st.OnlineLearner(gru(seed=0), xs[0, 0], optimizer=optax.adam(1e-2))
    init = single.state_dict()
    got = named_params(multi)
    for i in range(n):
        single.load_state_dict(init)
        p = np.stack([single.step(xs[t, i], ys[t, i]).prediction for t in range(steps)])
        np.testing.assert_allclose(preds[:, i], p, rtol=1e-6, atol=1e-10, err_msg=f"slot {i}")
        want = named_params(single)
        assert_params_close({k: v[i] for k, v in got.items()}, want)
        np.testing.assert_allclose(multi.state_dict()["hidden.cell.h"][i].ravel(),
                                   single.state_dict()["hidden.cell.h"].ravel(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(multi.stats()["prequential_loss"][i], single.stats()["prequential_loss"][0],
                                   rtol=1e-6)
    # the slots really learned different weights
    assert not np.allclose(got["cell.z.W"][0], got["cell.z.W"][1])


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_shared_weights_equal_batched_model(x64, reduce):
    n, steps = 16, 30
    xs, ys = data(steps, lead=(n,), seed=5)
    slots = st.OnlineLearner(gru(seed=0), xs[0, 0], optimizer=optax.sgd(0.05), slots=n, reduce=reduce)
    # a batched model: its loss is the mean over the whole (n, out) batch = mean of the
    # per-slot losses; reduce="sum" is n times that
    loss = "mse" if reduce == "mean" else (lambda p, y: n * jnp.mean((p - y) ** 2))
    batched = st.OnlineLearner(gru(seed=0), np.zeros((n, N_IN)), optimizer=optax.sgd(0.05), batch_size=n,
                               loss=loss)
    start = named_params(slots)
    for t in range(steps):
        a, b = slots.step(xs[t], ys[t]), batched.step(xs[t], ys[t])
        np.testing.assert_allclose(a.prediction, b.prediction, rtol=1e-6, atol=1e-10)
        assert a.loss.shape == (n,)
        agg = a.loss.mean() if reduce == "mean" else n * a.loss.mean()
        np.testing.assert_allclose(agg, b.loss[0], rtol=1e-5)
    assert_moved(named_params(slots), start)
    assert_params_close(named_params(slots), named_params(batched))
    np.testing.assert_allclose(slots.state_dict()["hidden.cell.h"].reshape(n, -1),
                               batched.state_dict()["hidden.cell.h"].reshape(n, -1), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("shared,mode", [(True, "supervised"), (False, "supervised"), (True, "forecast")],
                         ids=["shared", "per_slot", "shared-forecast"])
def test_reset_slot_touches_only_that_slot(x64, shared, mode):
    n, steps, i = 5, 12, 2
    n_out = N_IN if mode == "forecast" else N_OUT
    xs, ys = data(steps, lead=(n,), n_out=n_out, seed=6)
    if mode == "forecast":
        ys = [None] * steps
    learner = st.OnlineLearner(gru(seed=0, n_out=n_out), xs[0, 0], optimizer=optax.adam(1e-2), slots=n,
                               shared_weights=shared, mode=mode)
    init = learner.state_dict()
    first = learner.step(xs[0], ys[0])
    for t in range(1, steps):
        learner.step(xs[t], ys[t])
    before = learner.state_dict()
    learner.reset_slot(i)
    after = learner.state_dict()
    assert set(after) == set(before) == set(init)
    rows_seen = 0
    for name in before:
        if slot_rows(name, before[name], not shared):
            rows_seen += 1
            assert before[name].shape[0] == n, name
            others = [j for j in range(n) if j != i]
            np.testing.assert_array_equal(after[name][others], before[name][others], err_msg=name)
            np.testing.assert_array_equal(after[name][i], init[name][i], err_msg=name)
            # the slot had moved away from its initial state
            if name.startswith(("hidden.", "traces.", "pending.", "params.")):
                assert not np.array_equal(before[name][i], init[name][i]), name
        else:   # shared weights, optimizer state, counters
            np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert rows_seen >= (4 if mode == "forecast" else 3)
    pre = learner.stats()["prequential_loss"]
    assert pre[i] == 0 and np.all(pre[np.arange(n) != i] > 0)

    # the reset slot starts again from the initial hidden state and traces
    if shared:
        h0, tr0 = learner.algo.init_state()[1:]
        fwd = jax.jit(lambda p, x: learner.algo.forward(p, h0, tr0, (x,))[0])
        w_before = named_params(learner)
        again = learner.step(xs[0], ys[0])
        # supervised: predict, then learn; forecast: learn from the pending inputs, then predict
        w = w_before if mode == "supervised" else named_params(learner)
        np.testing.assert_allclose(again.prediction[i], np.asarray(fwd(w, jnp.asarray(xs[0, i]))),
                                   rtol=1e-9, atol=1e-12)
        if mode == "forecast":
            assert np.isnan(again.loss[i]) and np.all(np.isfinite(np.delete(again.loss, i)))
    else:
        # with its own weights it is a fresh learner: its next step repeats the very first one
        again = learner.step(xs[0], ys[0])
        np.testing.assert_array_equal(again.prediction[i], first.prediction[i])
        np.testing.assert_array_equal(again.loss[i], first.loss[i])
        assert not np.allclose(again.prediction[0], first.prediction[0])


def test_reset_slot_argument_checks(x64):
    single = st.OnlineLearner(gru(seed=0), np.zeros(N_IN), optimizer=optax.sgd(0.1))
    with pytest.raises(ValueError):
        single.reset_slot(0)
    multi = st.OnlineLearner(gru(seed=0), np.zeros(N_IN), optimizer=optax.sgd(0.1), slots=3)
    for bad in (-1, 3):
        with pytest.raises(IndexError):
            multi.reset_slot(bad)


def test_masked_slot_is_frozen_and_does_not_reach_the_weights(x64):
    n, steps, off = 4, 20, 2
    xs, ys = data(steps, lead=(n,), seed=7)
    xs[:, off] = np.nan                     # garbage in the inactive slot must not leak either
    ys[:, off] = np.nan
    keep = [j for j in range(n) if j != off]
    active = np.ones(n, bool)
    active[off] = False
    masked = st.OnlineLearner(gru(seed=0), xs[0, 0], optimizer=optax.adam(1e-2), slots=n)
    ref = st.OnlineLearner(gru(seed=0), xs[0, 0], optimizer=optax.adam(1e-2), slots=n - 1)
    init = masked.state_dict()
    start = named_params(masked)
    for t in range(steps):
        a = masked.step(xs[t], ys[t], active=active)
        b = ref.step(xs[t, keep], ys[t, keep])
        assert np.isnan(a.loss[off]) and np.all(np.isfinite(a.loss[keep]))
        np.testing.assert_allclose(a.prediction[keep], b.prediction, rtol=1e-6, atol=1e-10)
        np.testing.assert_allclose(a.loss[keep], b.loss, rtol=1e-6, atol=1e-10)
        assert a.applied
        s = masked.state_dict()
        for name in s:
            if name.startswith(("hidden.", "traces.")):
                np.testing.assert_array_equal(s[name][off], init[name][off], err_msg=name)
    assert_moved(named_params(masked), start)
    assert_params_close(named_params(masked), named_params(ref))
    sm, sr = masked.state_dict(), ref.state_dict()
    for name in sm:
        if name.startswith(("hidden.", "traces.")):
            np.testing.assert_allclose(sm[name][keep], sr[name], rtol=1e-9, atol=1e-12, err_msg=name)
    stats = masked.stats()
    assert stats["updates"] == steps and stats["skipped"] == 0 and stats["rejected"] == 0
    assert stats["prequential_loss"][off] == 0
    assert sm["stats.preq_n"][off] == 0 and np.all(sm["stats.preq_n"][keep] == steps)


def test_masked_slot_with_per_slot_weights_keeps_its_weights(x64):
    n, steps, off = 3, 6, 1
    xs, ys = data(steps, lead=(n,), seed=8)
    learner = st.OnlineLearner(gru(seed=0), xs[0, 0], optimizer=optax.adam(1e-2), slots=n, shared_weights=False)
    init = learner.state_dict()
    active = np.array([True, False, True])
    for t in range(steps):
        r = learner.step(xs[t], ys[t], active=active)
        assert list(r.applied) == [True, False, True]
    now = learner.state_dict()
    for name in now:
        if not name.startswith("stats."):
            np.testing.assert_array_equal(now[name][off], init[name][off], err_msg=name)
    assert not np.array_equal(now["params.cell.z.W"][0], init["params.cell.z.W"][0])


def test_learn_mask_slot_advances_without_learning(x64):
    """learn=False: the slot still advances (hidden state and traces), its target is not
    needed, and the shared weights are those of a learner fed only the learning slots."""
    n, steps, off = 3, 12, 1
    xs, ys = data(steps, lead=(n,), seed=10)
    ys[:, off] = np.nan                     # a non-learning slot's target is never read
    keep = [j for j in range(n) if j != off]
    learn = np.ones(n, bool)
    learn[off] = False
    learner = st.OnlineLearner(gru(seed=0), xs[0, 0], optimizer=optax.adam(1e-2), slots=n)
    ref = st.OnlineLearner(gru(seed=0), xs[0, 0], optimizer=optax.adam(1e-2), slots=n - 1)
    algo = ref.algo
    fwd = jax.jit(lambda p, h, tr, x: algo.forward(p, h, tr, (x,)))
    _, h, tr = algo.init_state()
    start = named_params(learner)
    for t in range(steps):
        w = named_params(ref)               # the weights the step predicts with
        a = learner.step(xs[t], ys[t], learn=learn)
        b = ref.step(xs[t, keep], ys[t, keep])
        out, h, tr = fwd(w, h, tr, jnp.asarray(xs[t, off]))
        np.testing.assert_allclose(a.prediction[off], np.asarray(out), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(a.prediction[keep], b.prediction, rtol=1e-6, atol=1e-10)
        assert np.isnan(a.loss[off]) and np.all(np.isfinite(a.loss[keep])) and a.applied
    assert_moved(named_params(learner), start)
    assert_params_close(named_params(learner), named_params(ref))
    s = learner.state_dict()
    np.testing.assert_allclose(s["hidden.cell.h"][off], np.asarray(h["cell.h"]), rtol=1e-9, atol=1e-12)
    for name in tr:
        np.testing.assert_allclose(s[f"traces.{name}"][off], np.asarray(tr[name]), rtol=1e-9, atol=1e-12)
    assert s["stats.preq_n"][off] == 0 and learner.stats()["skipped"] == 0

    # no slot learning: no target needed (even in supervised mode), no update
    before = named_params(learner)
    r = learner.step(xs[0], None, learn=np.zeros(n, bool))
    assert r.applied is False and np.all(np.isnan(r.loss))
    assert all(np.array_equal(before[k], v) for k, v in named_params(learner).items())


# ---- 4. modes and input checks ------------------------------------------------------------------
def test_predict_mode_advances_state_but_never_learns(x64):
    steps = 10
    xs, _ = data(steps, seed=9)
    learner = st.OnlineLearner(gru(seed=0), xs[0], mode="predict", optimizer=optax.sgd(1.0))
    init = learner.state_dict()
    algo = learner.algo
    p, h, tr = algo.init_state()
    fwd = jax.jit(lambda p, h, tr, x: algo.forward(p, h, tr, (x,)))
    for t in range(steps):
        r = learner.step(xs[t])
        out, h, tr = fwd(p, h, tr, jnp.asarray(xs[t]))
        np.testing.assert_allclose(r.prediction, np.asarray(out), rtol=1e-9, atol=1e-12)
        assert r.applied is False and np.all(np.isnan(r.loss))
    now = learner.state_dict()
    # the hidden state moved, exactly as the forward pass with the initial weights
    assert not np.array_equal(now["hidden.cell.h"], init["hidden.cell.h"])
    np.testing.assert_allclose(now["hidden.cell.h"].ravel(), np.asarray(h["cell.h"]).ravel(),
                               rtol=1e-12, atol=1e-14)
    # a target is accepted (and ignored)
    r = learner.step(xs[0], np.ones(N_OUT))
    assert r.applied is False
    now = learner.state_dict()
    for name in now:
        if name.startswith(("params.", "opt.")):
            np.testing.assert_array_equal(now[name], init[name], err_msg=name)
    stats = learner.stats()
    assert stats["step"] == steps + 1 and stats["updates"] == 0


def test_supervised_needs_a_target(x64):
    learner = st.OnlineLearner(gru(seed=0), np.zeros(N_IN))
    with pytest.raises(ValueError, match="target"):
        learner.step(np.zeros(N_IN))
    with pytest.raises(ValueError, match="target"):
        learner.step_many(np.zeros((2, N_IN)))


def test_wrong_shapes_are_refused_with_the_shape(x64):
    """The message names the shape given and the shape expected."""
    learner = st.OnlineLearner(gru(seed=0), np.zeros(N_IN), slots=2)
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 3\)"):
        learner.step(np.zeros((2, 4)), np.zeros((2, N_OUT)))
    with pytest.raises(ValueError, match=r"\(3,\).*\(2, 3\)"):
        learner.step(np.zeros(N_IN), np.zeros((2, N_OUT)))       # the slot axis is missing
    with pytest.raises(ValueError, match=r"target.*\(2, 3\).*\(2, 2\)"):
        learner.step(np.zeros((2, N_IN)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"target.*\(5, 2, 1\).*\(5, 2, 2\)"):
        learner.step_many(np.zeros((5, 2, N_IN)), np.zeros((5, 2, 1)))
    with pytest.raises(ValueError, match=r"\(4, 2, 4\).*\(4, 2, 3\)"):
        learner.step_many(np.zeros((4, 2, 4)), np.zeros((4, 2, N_OUT)))
    with pytest.raises(ValueError, match=r"active.*\(3,\).*\(2,\)"):
        learner.step(np.zeros((2, N_IN)), np.zeros((2, N_OUT)), active=np.ones(3, bool))
    with pytest.raises(ValueError, match=r"learn.*\(1,\).*\(2,\)"):
        learner.step(np.zeros((2, N_IN)), np.zeros((2, N_OUT)), learn=np.ones(1, bool))
    single = st.OnlineLearner(gru(seed=0), np.zeros(N_IN))
    with pytest.raises(ValueError, match=r"\(1, 3\).*\(3,\)"):
        single.step(np.zeros((1, N_IN)), np.zeros(N_OUT))         # no slot axis without slots
    # nothing was stepped by the refused calls
    assert learner.stats()["step"] == 0 and single.stats()["step"] == 0


def test_forecast_needs_output_shaped_like_input(x64):
    with pytest.raises(ValueError, match="forecast"):
        st.OnlineLearner(gru(seed=0, n_in=3, n_out=2), np.zeros(3), mode="forecast")
    # a matching shape is accepted; the first step has nothing to learn from yet
    learner = st.OnlineLearner(gru(seed=0, n_in=3, n_out=3), np.zeros(3), mode="forecast")
    r = learner.step(np.ones(3))
    assert r.prediction.shape == (3,) and np.all(np.isnan(r.loss)) and r.applied is False
    r = learner.step(np.ones(3) * 0.5)
    assert np.all(np.isfinite(r.loss)) and r.applied is True


def test_pure_step_is_the_compiled_step(x64):
    """learner.programs.pure_step() is the hot path as a pure function of the named state tree: run
    under jax.jit it gives the same predictions and state as learner.step."""
    learner = st.OnlineLearner(CellNet(nn.GRUCell, n_in=3, n_hidden=5, n_out=2), np.zeros(3),
                               optimizer=optax.adam(1e-2))
    state = learner.layout.unpack(learner.buffers)
    step = jax.jit(learner.programs.pure_step())
    rng = np.random.default_rng(4)
    for _ in range(5):
        x, y = rng.normal(size=3), rng.normal(size=2)
        state, pred, loss, applied = step(state, x, y)
        r = learner.step(x, y)
        np.testing.assert_allclose(pred, r.prediction, rtol=1e-12)
        np.testing.assert_allclose(loss, r.loss, rtol=1e-12)
    got = learner.layout.to_named(learner.layout.pack(state))
    want = learner.layout.to_named(learner.buffers)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, err_msg=name)
