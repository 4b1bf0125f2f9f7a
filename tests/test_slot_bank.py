"""A slot bank (learner/bank.py) seen from outside is the n-slot learner with a model per slot:
the same checkpoint signature and state names and shapes, a state written in by one read back
unchanged, and each slot stepping as a one-slot learner of its own (the oracle)."""
import numpy as np
import pytest

from streamtrace.engine import load_config
from streamtrace.engine.build import build_learner
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
