"""A slot bank (learner/bank.py) seen from outside is the n-slot learner with a model per slot:
the same checkpoint signature and state names and shapes, a state written in by one read back
unchanged, and each slot stepping as a one-slot learner of its own (the oracle)."""
import numpy as np
import pytest

from streamtrace.engine import load_config
from streamtrace.recipe.build import build_learner
from streamtrace.learner.bank import SlotBank

N, N_IN = 4, 2


def cfg():
    return load_config(None, {"model": {"stack": "gru", "n_in": N_IN, "n_hidden": 5, "n_out": N_IN},
                              "learning": {"mode": "forecast", "lr": 1e-2}, "engine": {"slots": N}})


def bank():
    c = cfg()
    return SlotBank(lambda n: build_learner(c, slots=n, shared_weights=False), N)


def test_signature_and_state_are_the_n_slot_learners():
    b, whole = bank(), build_learner(cfg(), slots=N, shared_weights=False)
    assert b.signature() == whole.signature()
    got, want = b.state_dict(), whole.state_dict()
    assert got.keys() == want.keys()
    for k in want:           # a fresh bank: every slot as built, as in the n-slot learner
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_a_state_loaded_reads_back_unchanged_and_a_bad_one_changes_nothing():
    whole = build_learner(cfg(), slots=N, shared_weights=False)
    rng = np.random.default_rng(0)
    for _ in range(3):       # an n-slot learner's state after some steps (a checkpoint of the old layout)
        whole.step(rng.normal(size=(N, N_IN)).astype(np.float32))
    saved = whole.state_dict()
    b = bank()
    b.load_state_dict(saved)
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v, saved[k], err_msg=k)
    before = b.state_dict()
    bad = {k: v[:N - 1] for k, v in saved.items()}
    with pytest.raises(ValueError, match="slots first"):
        b.load_state_dict(bad)
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_each_slot_steps_as_a_one_slot_learner_of_its_own():
    b = bank()
    refs = {s: build_learner(cfg(), slots=1, shared_weights=False) for s in (0, 3)}
    rng = np.random.default_rng(1)
    x, y, active, learn = b.views()
    active[0], learn[0] = True, True
    for t in range(6):
        for s, ref in refs.items():
            x[0] = rng.normal(size=N_IN)
            got = b.run(s)
            want = ref.step(x.copy())
            np.testing.assert_array_equal(got.prediction, want.prediction)
            np.testing.assert_array_equal(got.loss, want.loss)
    moved = b.read_slot(3)
    b.write_slot(1, moved)          # slot 3's state into slot 1: it goes on as slot 3 would
    b.reset_slot(3)                 # and slot 3 starts over, as built
    fresh = build_learner(cfg(), slots=1, shared_weights=False)
    x[0] = rng.normal(size=N_IN)
    np.testing.assert_array_equal(b.run(1).prediction, refs[3].step(x.copy()).prediction)
    np.testing.assert_array_equal(b.run(3).prediction, fresh.step(x.copy()).prediction)
    with pytest.raises(IndexError, match="out of range"):
        b.read_slot(N)


# ---- fixed weights held once (a frozen reservoir beside a learned cell, the engine's default) ----
RES, CELL = 12, 3


def hybrid_cfg():
    return load_config(None, {"model": {"stack": "reservoir", "n_in": N_IN, "n_hidden": RES, "n_out": N_IN,
                                        "precision": 64},
                              "transform": {"normalise": True, "residual": True}, "readout": {"kind": "rls"},
                              "learned": {"stack": "gru", "n_hidden": CELL}, "combine": {"experts": True},
                              "learning": {"mode": "forecast", "optimizer": "frozen"}, "engine": {"slots": N}})


def hybrid_bank():
    c = hybrid_cfg()
    return SlotBank(lambda n: build_learner(c, slots=n, shared_weights=False), N)


def test_the_reservoir_weights_are_held_once_and_a_slot_holds_the_rest():
    b = hybrid_bank()
    assert b._fixed_names == ["params.fixed"]
    # the reservoir's block: W_in (n_in x RES), bias (RES) and W (RES x RES), float64
    fixed = (N_IN + 1 + RES) * RES * 8
    assert b.shared_bytes() == fixed
    whole = sum(np.asarray(v).nbytes for v in build_learner(hybrid_cfg(), slots=1, shared_weights=False).buffers)
    assert b.slot_bytes() == whole - fixed
    for s in range(N):
        assert b.states[s][-1] is b.shared[0]


def test_each_slot_steps_as_a_one_slot_learner_with_shared_weights():
    b = hybrid_bank()
    refs = {s: build_learner(hybrid_cfg(), slots=1, shared_weights=False) for s in range(N)}
    rng = np.random.default_rng(2)
    x, y, active, learn = b.views()
    active[0], learn[0] = True, True
    for t in range(40):
        s = int(rng.integers(N))      # streams interleave in any order
        x[0] = np.sin(0.3 * t + s) + 0.1 * rng.normal(size=N_IN)
        got, want = b.run(s), refs[s].step(x.copy())
        np.testing.assert_array_equal(got.prediction, want.prediction)
        np.testing.assert_array_equal(got.loss, want.loss)
    for s in range(N):                # every slot's whole state (its learned GRU, readout, ...)
        for k, v in refs[s].state_dict().items():
            np.testing.assert_array_equal(b.state_dict()[k][s:s + 1], v, err_msg=k)
        assert b.states[s][-1] is b.shared[0]
    b.write_slot(0, b.read_slot(1))   # a parked stream moves: it goes on as slot 1 would
    b.reset_slot(1)
    fresh = build_learner(hybrid_cfg(), slots=1, shared_weights=False)
    x[0] = 0.5
    np.testing.assert_array_equal(b.run(0).prediction, refs[1].step(x.copy()).prediction)
    np.testing.assert_array_equal(b.run(1).prediction, fresh.step(x.copy()).prediction)
    assert all(b.states[s][-1] is b.shared[0] for s in range(N))


def test_checkpoints_load_both_ways_with_the_n_slot_learner():
    whole = build_learner(hybrid_cfg(), slots=N, shared_weights=False)
    b = hybrid_bank()
    assert b.signature() == whole.signature()
    rng = np.random.default_rng(3)
    for _ in range(5):
        whole.step(rng.normal(size=(N, N_IN)))
    b.load_state_dict(whole.state_dict())
    assert all(b.states[s][-1] is b.shared[0] for s in range(N))
    x, y, active, learn = b.views()
    active[0], learn[0] = True, True
    for s in range(N):
        x[0] = rng.normal(size=N_IN)
        b.run(s)
    back = build_learner(hybrid_cfg(), slots=N, shared_weights=False)
    back.load_state_dict(b.state_dict())
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[k], v, err_msg=k)


def test_fixed_weights_that_differ_from_the_shared_copy_are_refused_and_change_nothing():
    b = hybrid_bank()
    x, y, active, learn = b.views()
    active[0], learn[0] = True, True
    for s in range(N):
        x[0] = s
        b.run(s)
    before = b.state_dict()
    part = b.read_slot(2)
    assert not part["params"]["fixed"].flags.writeable      # the bank's one copy, not the slot's
    bad = {**part, "params": {**part["params"], "fixed": part["params"]["fixed"] + 1e-3}}
    with pytest.raises(ValueError, match="params.fixed.*differ"):
        b.write_slot(2, bad)
    named = dict(before)
    named["params.fixed.fixed.W"] = named["params.fixed.fixed.W"].copy()
    named["params.fixed.fixed.W"][3, 0, 0] += 1.0
    with pytest.raises(ValueError, match="params.fixed.*differ"):
        b.load_state_dict(named)
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    assert all(b.states[s][-1] is b.shared[0] for s in range(N))
    x[0] = 1.0
    ref = hybrid_bank()                # and the refused writes left the slot stepping as before
    rx = ref.views()
    rx[2][0] = rx[3][0] = True
    for s in range(N):
        rx[0][0] = s
        ref.run(s)
    rx[0][0] = 1.0
    np.testing.assert_array_equal(b.run(2).prediction, ref.run(2).prediction)


def test_a_label_keeps_the_shared_weights():
    """Delayed labels donate the slot's buffers; the fixed weights must stay (shared) arrays."""
    import jax
    import optax

    from streamtrace.learner import OnlineLearner, Slots, Supervised, param_groups
    from streamtrace.nn import Beside, GRUCell

    def make(n):
        model = Beside(fixed=GRUCell(N_IN, 4, key=jax.random.PRNGKey(0)),
                       learned=GRUCell(N_IN, 2, key=jax.random.PRNGKey(1)))
        groups = param_groups(fixed=("fixed.*", None), learned=("learned.*", optax.sgd(1e-2)))
        return OnlineLearner(model, np.zeros(N_IN, np.float32), optimizer=groups,
                             mode=Supervised(label_delay=2), slots=Slots(n, shared=False))
    b, ref = SlotBank(make, 2), make(1)
    assert b._fixed_names == ["params.fixed"]
    x, y, active, learn = b.views()
    active[0], learn[0] = True, True
    for t in range(4):
        x[0] = [t, 1.0]
        got, want = b.run(1), ref.step(x.copy())
        np.testing.assert_array_equal(got.prediction, want.prediction)
        target = np.full(6, 0.1 * t, np.float32)
        assert b.label(target, slot=1) == ref.label(target, slot=0)
        b.run(0)                      # the other slot still reads the shared weights
    got, want, fresh = b.state_dict(), ref.state_dict(), make(1).state_dict()
    learned = [k for k in want if k.startswith("params.learned")]
    assert learned and any(not np.array_equal(want[k], fresh[k]) for k in learned)   # labels were applied
    for k in learned:
        np.testing.assert_array_equal(got[k][1:], want[k], err_msg=k)
    assert b.states[0][-1] is b.shared[0] and b.states[1][-1] is b.shared[0]
