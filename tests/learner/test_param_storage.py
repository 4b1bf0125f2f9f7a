"""Weights stored as arrays of their own (models with a big weight, see ParamStore) learn
exactly what the hand-written limit program computes, and keep the packed block's names, so
a state dict moves between the two storages."""
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace.learner import groups

from test_limit_programs import H, LR, N_IN, N_OUT, limits, run_against_limit  # same model and yardstick


def _learner(algorithm="d-rtrl", slots=None, learn_every=1):
    return st.OnlineLearner(st.nn.Stack("gru", N_IN, H, N_OUT, seed=1), np.zeros(N_IN), algorithm=algorithm,
                            optimizer=optax.adam(LR), slots=slots, learn_every=learn_every)


@pytest.fixture
def separate(monkeypatch):
    monkeypatch.setattr(groups, "SEPARATE_FROM", 1)


@pytest.mark.parametrize("algorithm,slots", [("d-rtrl", None), ("d-rtrl", 3), ("es-d-rtrl", 3)])
def test_separate_weights_match_limit_program(x64, separate, algorithm, slots):
    learner = _learner(algorithm, slots)
    assert learner.fns.store.separate
    p0, p1 = run_against_limit(learner, algorithm, slots)
    for k in limits.GRU_PARAMS:
        assert np.max(np.abs(p1[k] - p0[k])) > 1e-4 or k == "cell.r.b"


def test_big_weight_selects_separate_storage():
    assert not _learner().fns.store.separate            # 8 x 5 weights: one block
    big = st.OnlineLearner(st.nn.Stack("gru", N_IN, 190, N_OUT), np.zeros(N_IN), optimizer=optax.adam(LR))
    assert big.fns.store.separate                       # 193 x 190 >= SEPARATE_FROM


@pytest.mark.parametrize("learn_every", [1, 2])
def test_state_dict_moves_between_storages(monkeypatch, learn_every):
    rng = np.random.default_rng(2)
    xs, ys = rng.normal(size=(7, N_IN)).astype(np.float32), rng.normal(size=(7, N_OUT)).astype(np.float32)
    packed = _learner(learn_every=learn_every)
    for t in range(5):
        packed.step(xs[t], ys[t])
    monkeypatch.setattr(groups, "SEPARATE_FROM", 1)
    sep = _learner(learn_every=learn_every)
    assert sep.fns.store.separate and not packed.fns.store.separate
    sep.load_state_dict(packed.state_dict())
    assert sorted(sep.state_dict()) == sorted(packed.state_dict())
    for k, v in packed.state_dict().items():
        np.testing.assert_array_equal(sep.state_dict()[k], v, err_msg=k)
    # and both go on learning the same way (float32, same arithmetic per weight)
    for t in range(5, 7):
        a, b = packed.step(xs[t], ys[t]), sep.step(xs[t], ys[t])
        np.testing.assert_allclose(a.prediction, b.prediction, rtol=1e-6, atol=1e-7)
    for k in packed.params:
        np.testing.assert_allclose(sep.params[k], packed.params[k], rtol=1e-6, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("old_header", [False, True], ids=["new-header", "header-without-state_dict"])
def test_checkpoint_moves_between_storages(monkeypatch, tmp_path, old_header):
    """A checkpoint is checked by the arrays it holds, not by how the writer stored its
    weights: one written by a packed learner (e.g. a GRU-256 saved before big weights got
    arrays of their own, whose header has no "state_dict") restores into a separate one."""
    from streamtrace.learner.checkpoint import CheckpointError, write_checkpoint
    rng = np.random.default_rng(4)
    packed = _learner()
    for _ in range(3):
        packed.step(rng.normal(size=N_IN).astype(np.float32), rng.normal(size=N_OUT).astype(np.float32))
    sig = packed.signature()
    if old_header:
        sig = {k: v for k, v in sig.items() if k != "state_dict"}
    path = write_checkpoint(tmp_path / "packed.npz", packed.state_dict(), sig)
    monkeypatch.setattr(groups, "SEPARATE_FROM", 1)
    sep = _learner()
    assert sep.signature()["state"] != packed.signature()["state"]          # the storages differ
    assert sep.signature()["state_dict"] == packed.signature()["state_dict"]
    sep.restore(path)
    for k, v in packed.state_dict().items():
        np.testing.assert_array_equal(sep.state_dict()[k], v, err_msg=k)
    # another model is still refused, by its arrays
    other = st.OnlineLearner(st.nn.Stack("gru", N_IN, H + 1, N_OUT, seed=1), np.zeros(N_IN),
                             optimizer=optax.adam(LR))
    with pytest.raises(CheckpointError, match="hidden.cell.h"):
        other.restore(path)
