"""The guard: non-finite inputs, targets, losses and gradients never reach the weights; the
step is skipped (per slot) and counted, and learning goes on. Plus global-norm clipping."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

from models import CellNet

N_IN, N_HIDDEN, N_OUT = 3, 6, 2
LEARNED = ("params.", "opt", "acc")            # what an update changes
CARRIED = ("hidden.", "traces.")               # what a step carries forward


def make(**kw):
    kw.setdefault("optimizer", optax.adam(1e-2))
    model = CellNet(nn.GRUCell, n_in=N_IN, n_hidden=N_HIDDEN, n_out=N_OUT, seed=0)
    return st.OnlineLearner(model, np.zeros(N_IN, np.float32), **kw)


def data(steps, slots=None, seed=0):
    rng = np.random.default_rng(seed)
    lead = (steps,) if slots is None else (steps, slots)
    xs = rng.normal(size=lead + (N_IN,)).astype(np.float32)
    ys = (0.5 * rng.normal(size=lead + (N_OUT,))).astype(np.float32)
    return xs, ys


def snapshot(learner):
    return {k: np.array(v, copy=True) for k, v in learner.state_dict().items()}


def part(state, prefixes):
    return {k: v for k, v in state.items() if k.startswith(prefixes)}


def assert_equal(a, b, what=""):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{what}{k} differs"


def assert_params_equal(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), f"weight {k} differs"


class Pair:
    """Two learners built once per module, reset to their initial state for every test."""

    def __init__(self, **kw):
        self.a, self.b = make(**kw), make(**kw)
        self.init = snapshot(self.a)

    def reset(self):
        self.a.load_state_dict(self.init)
        self.b.load_state_dict(self.init)
        return self.a, self.b


@pytest.fixture(scope="module")
def single():
    return Pair()


@pytest.fixture(scope="module")
def slotted():
    return Pair(slots=4)


# ---- non-finite inputs and targets, one stream ------------------------------------------
BAD = {
    "x-nan": (lambda x: x.__setitem__(1, np.nan), None),
    "x-inf": (lambda x: x.__setitem__(0, np.inf), None),
    "x-neg-inf": (lambda x: x.__setitem__(2, -np.inf), None),
    "target-nan": (None, lambda y: y.__setitem__(0, np.nan)),
    "target-inf": (None, lambda y: y.__setitem__(1, np.inf)),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_non_finite_sample_is_skipped_and_learning_continues(single, bad):
    L, ref = single.reset()                     # ref never sees the bad sample
    xs, ys = data(8)
    for t in range(3):
        L.step(xs[t], ys[t])
        ref.step(xs[t], ys[t])
    before, stats0 = snapshot(L), L.stats()

    x, y = xs[3].copy(), ys[3].copy()
    spoil_x, spoil_y = BAD[bad]
    (spoil_x or (lambda a: None))(x)
    (spoil_y or (lambda a: None))(y)
    r = L.step(x, y)

    assert r.applied is False
    assert np.isnan(r.loss).all()
    after = snapshot(L)
    assert_equal(part(after, LEARNED), part(before, LEARNED))      # weights and optimizer state
    assert_equal(part(after, CARRIED), part(before, CARRIED))      # hidden state and traces
    assert_equal(part(after, ("stats.preq",)), part(before, ("stats.preq",)))
    assert all(np.isfinite(w).all() for w in L.params.values())
    stats = L.stats()
    assert stats["skipped"] == stats0["skipped"] + 1
    assert stats["step"] == stats0["step"] + 1
    assert stats["updates"] == stats0["updates"] and stats["rejected"] == stats0["rejected"]

    # learning goes on exactly as if the bad sample had never arrived
    for t in range(4, 8):
        r, rr = L.step(xs[t], ys[t]), ref.step(xs[t], ys[t])
        assert r.applied is True
        assert np.array_equal(r.prediction, rr.prediction) and np.array_equal(r.loss, rr.loss)
    assert not np.array_equal(L.params["cell.z.W"], before["params.cell.z.W"])
    assert_params_equal(L.params, ref.params)
    assert_equal(part(snapshot(L), CARRIED + ("opt",)), part(snapshot(ref), CARRIED + ("opt",)))
    assert L.stats()["updates"] == ref.stats()["updates"] == 7
    assert L.stats()["skipped"] == 1 and ref.stats()["skipped"] == 0


def test_loss_overflow_is_not_applied(single):
    """A finite target so large that the loss overflows to inf: no update, counted."""
    L, _ = single.reset()
    xs, ys = data(3)
    L.step(xs[0], ys[0])
    before, stats0 = snapshot(L), L.stats()
    r = L.step(xs[1], np.array([1e38, 0.0], np.float32))
    assert r.applied is False
    after, stats = snapshot(L), L.stats()
    assert_equal(part(after, LEARNED), part(before, LEARNED))
    assert all(np.isfinite(w).all() for w in L.params.values())
    assert (stats["rejected"] + stats["skipped"]) == (stats0["rejected"] + stats0["skipped"]) + 1
    assert stats["updates"] == stats0["updates"]
    assert L.step(xs[2], ys[2]).applied is True


@jax.custom_vjp
def _poison(pred, flag):
    return pred


_poison.defvjp(lambda pred, flag: (pred, flag),
               lambda flag, g: (jnp.where(flag > 0, jnp.nan, 1.0) * g, jnp.zeros_like(flag)))


def poisoned_mse(pred, target):
    """MSE whose gradient is NaN (value finite) when the target's last entry exceeds 1e3."""
    flag = (target[-1] > 1e3).astype(jnp.float32)
    return jnp.mean((_poison(pred, flag) - target) ** 2)


@pytest.mark.parametrize("storage", ["packed", "separate"])
def test_non_finite_gradient_with_finite_loss_is_rejected(monkeypatch, storage):
    if storage == "separate":        # each weight apart, none checked whole but the smallest
        from streamtrace.learner import groups, step
        monkeypatch.setattr(groups, "SEPARATE_FROM", 1)
        monkeypatch.setattr(step, "CHECK_BELOW", 1)
    L = make(optimizer=optax.sgd(0.1), loss=poisoned_mse)
    assert L.fns.store.separate == (storage == "separate")
    xs, ys = data(4)
    L.step(xs[0], ys[0])
    before, stats0 = snapshot(L), L.stats()
    r = L.step(xs[1], np.array([0.0, 1e4], np.float32))
    assert r.applied is False
    assert np.isfinite(r.loss).all()          # the sample itself was fine, only its gradient not
    assert_equal(part(snapshot(L), LEARNED), part(before, LEARNED))
    stats = L.stats()
    assert stats["rejected"] == stats0["rejected"] + 1
    assert stats["updates"] == stats0["updates"] and stats["skipped"] == stats0["skipped"]
    r = L.step(xs[2], ys[2])
    assert r.applied is True and L.stats()["updates"] == stats0["updates"] + 1
    assert not np.array_equal(L.params["out.W"], before["params.out.W"])


# ---- slots ------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["x", "target"])
def test_nan_in_one_slot_skips_only_that_slot(slotted, where):
    A, B = slotted.reset()
    xs, ys = data(5, slots=4, seed=3)
    for t in range(2):
        A.step(xs[t], ys[t])
        B.step(xs[t], ys[t])
    before = snapshot(A)
    x, y = xs[2].copy(), ys[2].copy()
    (x if where == "x" else y)[2, 1] = np.nan
    ra = A.step(x, y)
    rb = B.step(xs[2], ys[2], active=[True, True, False, True])   # slot 2 masked inactive

    assert ra.applied is True and rb.applied is True
    assert np.isnan(ra.loss[2]) and np.isfinite(ra.loss[[0, 1, 3]]).all()
    assert np.array_equal(ra.loss, rb.loss, equal_nan=True)
    assert np.array_equal(ra.prediction[[0, 1, 3]], rb.prediction[[0, 1, 3]])
    # the shared weights got the update of the three good slots, exactly
    assert_params_equal(A.params, B.params)
    assert not np.array_equal(A.params["cell.z.W"], before["params.cell.z.W"])
    assert all(np.isfinite(w).all() for w in A.params.values())
    sa, sb = snapshot(A), snapshot(B)
    assert_equal(part(sa, LEARNED + CARRIED), part(sb, LEARNED + CARRIED))
    for k, v in part(sa, CARRIED).items():
        assert np.array_equal(v[2], before[k][2]), f"slot 2 {k} moved"
        if k.startswith("hidden."):
            assert not np.array_equal(v[[0, 1, 3]], before[k][[0, 1, 3]]), f"{k} did not advance"
    assert A.stats()["skipped"] == 1 and B.stats()["skipped"] == 0
    assert A.stats()["updates"] == B.stats()["updates"] == 3

    # the skipped slot takes part again at the next step
    ra = A.step(xs[3], ys[3])
    assert np.isfinite(ra.loss).all() and ra.applied is True
    assert not np.array_equal(snapshot(A)["hidden.cell.h"][2], before["hidden.cell.h"][2])


def test_loss_overflow_in_one_slot_does_not_reach_shared_weights(slotted):
    A, B = slotted.reset()
    xs, ys = data(2, slots=4, seed=4)
    A.step(xs[0], ys[0])
    B.step(xs[0], ys[0])
    y = ys[1].copy()
    y[2, 0] = 1e20                      # (out - 1e20)**2 overflows float32; its gradient does not
    ra = A.step(xs[1], y)
    rb = B.step(xs[1], ys[1], active=[True, True, False, True])     # slot 2 masked inactive
    assert np.isnan(ra.loss[2]) and A.stats()["skipped"] == 1        # reported as skipped
    assert np.array_equal(ra.loss, rb.loss, equal_nan=True)
    # so the update must be the three good slots' one
    assert_params_equal(A.params, B.params)
    assert_equal(part(snapshot(A), ("opt",)), part(snapshot(B), ("opt",)))


def test_nan_in_one_slot_with_per_slot_weights():
    L = make(slots=4, shared_weights=False, optimizer=optax.sgd(0.1))
    xs, ys = data(2, slots=4, seed=5)
    L.step(xs[0], ys[0])
    before = L.params
    x = xs[1].copy()
    x[1, 0] = np.inf
    r = L.step(x, ys[1])
    assert np.array_equal(r.applied, [True, False, True, True])
    for k, w in L.params.items():
        assert np.array_equal(w[1], before[k][1]), k
    assert all(not np.array_equal(L.params[k][[0, 2, 3]], before[k][[0, 2, 3]])
               for k in ("cell.z.W", "out.W"))
    assert L.stats()["skipped"] == 1


def test_non_finite_gradient_in_one_slot_with_per_slot_weights_is_rejected_there_only():
    """A model per slot runs the step under vmap, so its gradient check does too (a product
    with ones that keeps the slot axis): the slot whose gradient is NaN (its loss finite) keeps
    its weights and optimizer state, the others learn as a twin learner where that slot is
    masked out of learning."""
    L = make(slots=3, shared_weights=False, loss=poisoned_mse)
    twin = make(slots=3, shared_weights=False, loss=poisoned_mse)
    xs, ys = data(3, slots=3, seed=6)
    for t in range(2):
        L.step(xs[t], ys[t])
        twin.step(xs[t], ys[t])
    before, stats0 = snapshot(L), L.stats()
    y = ys[2].copy()
    y[1, -1] = 1e4                       # slot 1: a finite loss with a NaN gradient
    r = L.step(xs[2], y)
    twin.step(xs[2], ys[2], learn=[True, False, True])
    assert np.array_equal(r.applied, [True, False, True])
    assert np.isfinite(r.loss[[0, 2]]).all()
    after = snapshot(L)
    for k, v in part(after, LEARNED).items():
        assert np.array_equal(v[1], before[k][1]), f"slot 1 {k} moved"
    assert_equal(part(after, LEARNED), part(snapshot(twin), LEARNED))
    assert L.stats()["rejected"] == stats0["rejected"] + 1


@pytest.mark.parametrize("axis", [0, 1])
def test_slot_sums_under_vmap_equal_numpy_and_keep_non_finite_values_to_their_slot(axis):
    """The sums behind the finiteness checks (a product with ones) give numpy's sums with or
    without vmap, whichever axis vmap maps; a NaN or inf stays in its own slot's sum."""
    from streamtrace.learner.step import _ones_dot
    rng = np.random.default_rng(7)
    a = rng.normal(size=(4, 1, 5, 3)).astype(np.float32)     # 4 slots of (1, 5, 3)
    a[1, 0, 2, 1], a[3, 0, 0, 0] = np.nan, np.inf
    want = np.array([s.sum() for s in a.astype(np.float64)])
    moved = np.moveaxis(a, 0, axis)
    got = np.asarray(jax.jit(jax.vmap(_ones_dot, in_axes=axis))(moved)).reshape(-1)
    plain = np.array([np.asarray(_ones_dot(jnp.asarray(s))).item() for s in a])
    for out in (got, plain):
        assert np.isnan(out[1]) and np.isinf(out[3])
        np.testing.assert_allclose(out[[0, 2]], want[[0, 2]], rtol=1e-5)
    flat = np.asarray(jax.vmap(_ones_dot)(a.reshape(4, 1, 15))).reshape(-1)   # the (n, -1) branch
    np.testing.assert_allclose(flat[[0, 2]], want[[0, 2]], rtol=1e-5)
    assert np.isnan(flat[1]) and np.isinf(flat[3])


def test_skipped_step_does_not_count_toward_learn_every():
    """learn_every=2: good, NaN, good -> one update of the two good gradients, exactly as a
    learner that only saw the good samples."""
    A, B = make(learn_every=2, optimizer=optax.sgd(0.05)), make(learn_every=2, optimizer=optax.sgd(0.05))
    xs, ys = data(3, seed=6)
    w0 = A.params
    assert A.step(xs[0], ys[0]).applied is False
    bad = xs[1].copy()
    bad[0] = np.nan
    assert A.step(bad, ys[1]).applied is False
    assert_params_equal(A.params, w0)
    assert A.step(xs[2], ys[2]).applied is True
    B.step(xs[0], ys[0])
    assert B.step(xs[2], ys[2]).applied is True
    assert_params_equal(A.params, B.params)
    assert A.stats()["updates"] == 1 and A.stats()["skipped"] == 1


# ---- clipping ---------------------------------------------------------------------------
@pytest.mark.parametrize("clip", [0.1, None])
def test_clipped_sgd_update_matches_independent_gradient(clip):
    lr = 0.5
    L = make(optimizer=optax.sgd(lr), clip=clip)
    xs, ys = data(4, seed=8)
    for t in range(3):                 # non-zero hidden state and traces
        L.step(xs[t], ys[t])
    state = L.state_dict()
    p0 = L.params
    hidden = {k[len("hidden."):]: v[0] for k, v in state.items() if k.startswith("hidden.")}
    traces = {k[len("traces."):]: v[0] for k, v in state.items() if k.startswith("traces.")}
    p_init, h_init, tr_init = L.algo.init_state()
    assert set(hidden) == set(h_init) and set(traces) == set(tr_init) and set(p0) == set(p_init)

    x, y = xs[3], np.array([10.0, -10.0], np.float32)      # a big error: a big gradient

    def loss(p):
        out, _, _ = L.algo(p, hidden, traces, jnp.asarray(x))
        return jnp.mean((out - y) ** 2)
    g = jax.jit(jax.grad(loss))({k: jnp.asarray(v) for k, v in p0.items()})
    g = {k: np.asarray(v, np.float64) for k, v in g.items()}
    norm = np.sqrt(sum(np.sum(v ** 2) for v in g.values()))
    assert norm > 1.0
    scale = 1.0 if clip is None else min(1.0, clip / norm)

    r = L.step(x, y)
    assert r.applied is True
    step_norm = 0.0
    for k in p0:
        got = L.params[k].astype(np.float64) - p0[k]
        np.testing.assert_allclose(got, -lr * g[k] * scale, rtol=2e-4, atol=1e-6, err_msg=k)
        step_norm += np.sum(got ** 2)
    expected_norm = lr * (norm if clip is None else clip)
    assert np.sqrt(step_norm) == pytest.approx(expected_norm, rel=1e-3)


def test_non_finite_trace_value_keeps_its_old_value_inside_the_step():
    """The trace guard is part of the step: a trace value that comes out of the update not
    finite keeps its old value, every other value advances as without the fault, and the
    gradient reads the guarded traces (the update stays finite). The fault is injected into
    the trace update of a slot whose first input is the marker; the twin learner runs the
    same program with a marker that never comes."""
    def inject(learner, marker):
        advance = learner.algo._advance

        def faulty(params, hidden, traces, args):     # one slot (vmapped)
            out, h, tr, P = advance(params, hidden, traces, args)
            flat = tr[name].reshape(-1)
            flat = flat.at[0].set(jnp.where(args[0][0] == marker, jnp.nan, flat[0]))
            return out, h, {**tr, name: flat.reshape(tr[name].shape)}, P
        learner.algo._advance = faulty
        return learner
    L, ref = make(slots=2), make(slots=2)
    name = sorted(L.algo.init_traces())[0]
    inject(L, 7.0), inject(ref, -7.0)

    xs, ys = data(4, slots=2, seed=5)
    xs[2, 0, 0] = 7.0
    for t in range(2):
        L.step(xs[t], ys[t])
        ref.step(xs[t], ys[t])
    before = snapshot(L)
    assert_equal(part(before, LEARNED + CARRIED), part(snapshot(ref), LEARNED + CARRIED))
    r = L.step(xs[2], ys[2])
    ref.step(xs[2], ys[2])
    after, want = snapshot(L), snapshot(ref)

    assert r.applied is True and np.isfinite(r.loss).all()
    assert all(np.isfinite(w).all() for w in L.params.values())
    assert all(np.isfinite(v).all() for v in part(after, CARRIED).values())
    assert_equal(part(after, ("hidden.",)), part(want, ("hidden.",)))
    key = "traces." + name
    for k, v in part(after, ("traces.",)).items():
        expect = want[k].copy()
        if k == key:
            old = before[k].reshape(2, -1)[0, 0]
            assert expect.reshape(2, -1)[0, 0] != old          # the fault hid a real change
            expect.reshape(2, -1)[0, 0] = old
        assert np.array_equal(v, expect), f"{k} differs from the fault-free step"
    assert L.stats()["skipped"] == 0


@pytest.mark.parametrize("adam", [optax.adam, st.adam], ids=["optax", "in-place"])
def test_gradient_value_that_overflows_keeps_its_weight_value(monkeypatch, adam):
    """Weights of CHECK_BELOW values or more are stored apart and their gradient is not read
    whole: a value of it that is not finite keeps its weight value and its Adam moments,
    every other value learns as without the fault, and the step counts as applied. The fault:
    one trace value of slot 0 set to the float32 maximum (finite, so the trace keeps it),
    whose product with a learning signal above 1 overflows in that one gradient value. The
    twin learner runs the same program with a marker that never comes."""
    from streamtrace.learner import groups, step
    monkeypatch.setattr(groups, "SEPARATE_FROM", 1)    # every weight an array of its own
    monkeypatch.setattr(step, "CHECK_BELOW", 20)       # biases and readout checked, matrices not

    def inject(learner, marker, name):
        advance = learner.algo._advance

        def faulty(params, hidden, traces, args):     # one slot (vmapped)
            out, h, tr, P = advance(params, hidden, traces, args)
            flat = tr[name].reshape(-1)
            big = jnp.finfo(flat.dtype).max
            flat = flat.at[0].set(jnp.where(args[0][0] == marker, big, flat[0]))
            return out, h, {**tr, name: flat.reshape(tr[name].shape)}, P
        learner.algo._advance = faulty
    L, ref = make(slots=2, optimizer=adam(1e-2)), make(slots=2, optimizer=adam(1e-2))
    assert L.fns.store.separate
    trace = next(k for k in sorted(L.algo.init_traces()) if k.startswith("eps.") and k.endswith(".W"))
    weight = trace[len("eps."):]
    inject(L, 7.0, trace), inject(ref, -7.0, trace)

    xs, ys = data(3, slots=2, seed=9)
    xs[1, 0, 0] = 7.0
    ys[1] = 300.0                         # a learning signal far above 1
    L.step(xs[0], ys[0]), ref.step(xs[0], ys[0])
    before = snapshot(L)
    ra, rb = L.step(xs[1], ys[1]), ref.step(xs[1], ys[1])
    after, want = snapshot(L), snapshot(ref)

    assert ra.applied is True and rb.applied is True and L.stats()["rejected"] == 0
    assert all(np.isfinite(v).all() for k, v in after.items() if k.startswith(("params.", "opt")))
    moved = [k for k in after if k.startswith(("params.", "opt")) and k.endswith(weight)]
    assert len(moved) == 3                # the weight, its first and second moment
    for k in after:
        if not k.startswith(("params.", "opt")):
            continue
        expect = want[k].copy()
        if k in moved:
            assert expect.reshape(-1)[0] != before[k].reshape(-1)[0]   # the fault hid a real update
            expect.reshape(-1)[0] = before[k].reshape(-1)[0]
        assert np.array_equal(after[k], expect), f"{k} differs from the fault-free step"
