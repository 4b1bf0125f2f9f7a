"""A step over a subset of the slots (gather, step, scatter) is the full N-slot step with
only those slots active: the oracle is the full step itself, run on a twin learner with an
active mask, over many random steps, in float64. Every leaf of the state must agree, slots
outside the subset must be untouched bit for bit, and answers for the subset must match."""
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

N = 5


def _twins(**kw):
    def make():
        return st.OnlineLearner(nn.Stack("gru", 2, 6, 2, seed=3), np.zeros(2, np.float64), slots=N,
                                optimizer=optax.adam(1e-2), **kw)
    return make(), make()


CASES = {
    "shared-supervised-d-rtrl": dict(algorithm="d-rtrl", mode="supervised", shared_weights=True),
    "per-slot-forecast-es": dict(algorithm="es-d-rtrl", mode="forecast", shared_weights=False),
    "per-slot-forecast-quality": dict(algorithm="d-rtrl", mode="forecast", shared_weights=False,
                                      transform=st.chain(st.normalise(warmup=4, rate=0.05), st.residual()),
                                      readout=st.rls(lam=0.99, delta=1e-2), learn_every=2),
    "shared-forecast-horizon": dict(algorithm="d-rtrl", mode=st.Forecast(horizon=2), shared_weights=True,
                                    learn_every=3),
    # most per-slot leaves (the step counters too) standalone, a few still packed: both ways
    # of reading and writing a subset's rows (learner/subset.py)
    "per-slot-mostly-standalone": dict(algorithm="d-rtrl", mode="forecast", shared_weights=False, standalone=8),
}


@pytest.mark.parametrize("case", CASES)
def test_subset_step_equals_full_step_with_a_mask(x64, case):
    full, sub = _twins(**CASES[case])
    supervised = CASES[case]["mode"] == "supervised"
    rng = np.random.default_rng(7)
    untouched_checked = 0
    for t in range(30):
        m = (1, 3)[t % 2]                       # two subset sizes (each one compiled program)
        idx = np.sort(rng.choice(N, m, replace=False)) if t % 3 else rng.choice(N, m, replace=False)
        x = rng.normal(size=(N, 2)) + np.sin(0.3 * t)
        y = rng.normal(size=(N, 2)) if supervised else None
        learn = rng.random(N) < 0.8
        active = np.zeros(N, bool)
        active[idx] = rng.random(m) < 0.85       # a subset may hold idle slots (the engine pads with them)
        before = sub.state_dict()
        want = full.step(x, y, active=active, learn=learn)
        got = sub.step_slots(idx, x[idx], None if y is None else y[idx], active=active[idx], learn=learn[idx])
        on = active[idx]
        np.testing.assert_allclose(got.prediction[on], want.prediction[idx][on], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got.loss, want.loss[idx], rtol=1e-10, atol=1e-12)
        if isinstance(want.applied, np.ndarray):
            np.testing.assert_array_equal(got.applied, want.applied[idx])
        else:
            assert got.applied == want.applied
        a, b = full.state_dict(), sub.state_dict()
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-9, atol=1e-12, err_msg=f"{case} step {t}: {k}")
        # slots outside the subset, or idle in it, keep their state (only the per-slot step
        # counter moves, as in the full step)
        rest = np.setdiff1d(np.arange(N), idx[on])
        for k, v in b.items():
            if np.ndim(v) and np.shape(v)[0] == N and not k.startswith("stats.counters"):
                np.testing.assert_array_equal(v[rest], before[k][rest], err_msg=f"{case}: {k} touched")
                untouched_checked += 1
    assert untouched_checked > 30
    # the twins really learned (the comparison is not between two idle learners)
    assert full.stats()["updates"] > 5


def test_step_slots_refuses_bad_slot_lists_without_touching_state():
    L = st.OnlineLearner(nn.Stack("gru", 2, 4, 2), np.zeros(2, np.float32), slots=3, mode="forecast")
    L.step_slots([1], np.ones((1, 2), np.float32))
    before = L.state_dict()
    for bad in ([], [3], [-1], [0, 0], [[0]], [0.5]):
        with pytest.raises(ValueError, match="slots"):
            L.step_slots(bad, np.ones((max(len(np.ravel(bad)), 1), 2), np.float32))
    with pytest.raises(ValueError, match="x has shape"):
        L.step_slots([0, 2], np.ones((3, 2), np.float32))
    after = L.state_dict()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    with pytest.raises(ValueError, match="needs a learner with slots"):
        st.OnlineLearner(nn.Stack("gru", 2, 4, 2), np.zeros(2, np.float32)).step_slots([0], np.ones((1, 2)))


def test_several_steps_in_one_subset_call_equal_that_many_full_steps(x64):
    """The engine's path: ``count`` of K prepared steps of m slots in one call; rows past
    ``count`` are ignored (their inputs here are garbage that must not be used)."""
    full, sub = _twins(**CASES["per-slot-forecast-es"])
    rng = np.random.default_rng(3)
    idx = np.array([4, 1], np.int32)
    for count in (3, 1, 4, 2):
        K = 4
        xs = rng.normal(size=(K, 2, 2))
        xs[count:] = 1e30                      # beyond count: must not be stepped
        act = np.ones((K, 2), bool)
        learn = rng.random((K, 2)) < 0.7
        want = []
        for j in range(count):
            x = np.zeros((N, 2))
            x[idx] = xs[j]
            a = np.zeros(N, bool)
            a[idx] = True
            lf = np.zeros(N, bool)
            lf[idx] = learn[j]
            want.append(full.step(x, active=a, learn=lf))
        sub.buffers, rows = sub.programs.run_subset(sub.buffers, idx, count, xs, np.zeros((K, 2, 2)), act, learn)
        assert rows.shape[0] == K
        for j in range(count):
            got = sub.programs.decode(rows[j], m=2)
            np.testing.assert_allclose(got.prediction, want[j].prediction[idx], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(got.loss, want[j].loss[idx], rtol=1e-10, atol=1e-12)
        a, b = full.state_dict(), sub.state_dict()
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert full.stats()["updates"] > 3
