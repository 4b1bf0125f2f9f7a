"""Checkpoints: exact resume (also in a fresh process), with all the learning-quality state
(normaliser statistics, RLS readouts per slot, parameter-group optimizer states, the pending
forecast and the rolling metrics), and the model's and the optimizer's settings recorded in
them (another model's refused, other optimizer settings warned about). Damaged files, the
checkpoint folder and the file format: test_checkpoint_files.py."""
import logging
import sys

import numpy as np
import optax
import pytest

from streamtrace.learner import CheckpointDir, CheckpointError, write_checkpoint
from streamtrace.learner.describe import describe_model, describe_optimizer
import models
from checkpoint_helpers import (TESTS_DIR, COMMON, snapshot, assert_same_state, base, learner,
                                QUALITY_COMMON, _learner, _train, _same, run_in_fresh_process,
                                make_learner, make_data, STEPS, CUT, N_IN, make_quality_learner,
                                make_quality_data, Q_STEPS, Q_CUT)  # noqa: F401 (fixtures)

# ---- 1. exact resume -------------------------------------------------------------------


def test_resume_in_fresh_process_is_bit_identical(tmp_path):
    xs, ys = make_data()
    L = make_learner()
    for t in range(CUT):
        L.step(xs[t], ys[t])
    ckpt = tmp_path / "step50.npz"
    L.save(ckpt, extra={"note": "half way"})
    at_cut = snapshot(L)
    preds = np.stack([L.step(xs[t], ys[t]).prediction for t in range(CUT, STEPS)])
    final = snapshot(L)
    assert L.stats()["step"] == STEPS

    out = tmp_path / "resumed.npz"
    script = "\n".join([
        "import sys",
        f"sys.path.insert(0, {str(TESTS_DIR)!r})",
        COMMON,
        "L = make_learner()",
        "xs, ys = make_data()",
        f"header = L.restore({str(ckpt)!r})",
        "assert header['extra'] == {'note': 'half way'}, header['extra']",
        "restored = L.state_dict()",
        "preds = np.stack([L.step(xs[t], ys[t]).prediction for t in range(CUT, STEPS)])",
        "arrays = {'restored.' + k: v for k, v in restored.items()}",
        "arrays.update({'final.' + k: v for k, v in L.state_dict().items()})",
        f"np.savez({str(out)!r}, preds=preds, **arrays)",
    ])
    got = run_in_fresh_process(script, out, tmp_path)
    restored = {k[len("restored."):]: v for k, v in got.items() if k.startswith("restored.")}
    resumed_final = {k[len("final."):]: v for k, v in got.items() if k.startswith("final.")}
    assert_same_state(restored, at_cut)
    assert got["preds"].dtype == preds.dtype == np.float32
    assert np.array_equal(got["preds"], preds)
    assert_same_state(resumed_final, final)   # weights, optimizer state, hidden, traces, stats
    for name, w in L.params.items():
        assert np.array_equal(resumed_final["params." + name], w)


@pytest.mark.parametrize("config", [
    dict(algorithm="es-d-rtrl", learn_every=3, slots=2, shared_weights=False, clip=1.0),
    dict(algorithm="rtrl", slots=3, optimizer=optax.sgd(0.05, momentum=0.9)),
], ids=["es-d-rtrl-learn3-perslot-clip", "rtrl-slots-momentum"])
def test_resume_in_process_other_configurations(tmp_path, config):
    """Save/restore into a second learner object carries every piece of state (summed
    gradients between updates, per-slot weights, momentum), so the runs stay identical."""
    n = config.get("slots")
    rng = np.random.default_rng(7)
    xs = rng.normal(size=(24, n, N_IN)).astype(np.float32)
    ys = rng.normal(size=(24, n, 2)).astype(np.float32)
    A = make_learner(**config)
    for t in range(10):     # 10 is not a multiple of learn_every: summed gradients are pending
        A.step(xs[t], ys[t])
    A.save(tmp_path / "c.npz")
    B = make_learner(**config)
    B.restore(tmp_path / "c.npz")
    assert_same_state(snapshot(B), snapshot(A))
    for t in range(10, 24):
        ra, rb = A.step(xs[t], ys[t]), B.step(xs[t], ys[t])
        assert np.array_equal(ra.prediction, rb.prediction)
        assert np.array_equal(ra.applied, rb.applied)
    assert_same_state(snapshot(B), snapshot(A))
    assert A.stats()["updates"] > 0


def test_all_new_state_restores_bit_identically_in_another_process(tmp_path):
    xs = make_quality_data()
    L = make_quality_learner()
    for t in range(Q_CUT):
        L.step(xs[t])
    at_cut = snapshot(L)
    # the checkpoint really holds the new kinds of state, already past warm-up and moving
    for key in ("signal.normalise.x.mean", "readout.W", "readout.P", "pending.pred", "stats.roll.se",
                "params.recurrent.W", "params.inputs.W_in"):
        assert key in at_cut, key
    assert np.any(at_cut["readout.W"]) and L.stats()["updates"] > 0
    assert any(k.startswith("opt.") and k.endswith("inputs.W_in") for k in at_cut)
    ckpt = tmp_path / "cut.npz"
    L.save(ckpt)
    preds = np.stack([L.step(xs[t]).prediction for t in range(Q_CUT, Q_STEPS)])
    assert preds.shape == (Q_STEPS - Q_CUT, 2, 3, 1)
    final, metrics = snapshot(L), L.stats()["metrics"]

    out = tmp_path / "resumed.npz"
    script = "\n".join([
        QUALITY_COMMON,
        "L = make_learner()",
        "xs = make_data()",
        f"L.restore({str(ckpt)!r})",
        "restored = L.state_dict()",
        "preds = np.stack([L.step(xs[t]).prediction for t in range(CUT, STEPS)])",
        "m = L.stats()['metrics']",
        "arrays = {'restored.' + k: v for k, v in restored.items()}",
        "arrays.update({'final.' + k: v for k, v in L.state_dict().items()})",
        "arrays.update({'metric.' + k: np.asarray(v) for k, v in m.items()})",
        f"np.savez({str(out)!r}, preds=preds, **arrays)",
    ])
    got = run_in_fresh_process(script, out, tmp_path)
    for prefix, want in (("restored.", at_cut), ("final.", final)):
        have = {k[len(prefix):]: v for k, v in got.items() if k.startswith(prefix)}
        assert sorted(have) == sorted(want)
        for k in want:
            assert have[k].dtype == want[k].dtype, k
            assert np.array_equal(have[k], want[k], equal_nan=True), f"{prefix}{k} differs"
    assert got["preds"].dtype == preds.dtype
    assert np.array_equal(got["preds"], preds)
    for k, v in metrics.items():
        assert np.array_equal(got["metric." + k], v, equal_nan=True), k


def test_micro_batched_steps_equal_single_steps():
    """step_many (a scan inside one call) carries the same composite state as single steps."""
    xs = make_quality_data()[:24]
    a, b = make_quality_learner(), make_quality_learner()
    singles = np.stack([a.step(x).prediction for x in xs])
    batched = np.concatenate([np.stack([r.prediction for r in b.step_many(xs[i:i + 8])]) for i in range(0, 24, 8)])
    np.testing.assert_allclose(batched, singles, rtol=1e-5, atol=1e-5)
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        np.testing.assert_allclose(sb[k], sa[k], rtol=1e-5, atol=1e-5, err_msg=k)




# ---- 3. settings recorded in the checkpoint ------------------------------------------------
@pytest.mark.parametrize("change,named", [({"gain": 5.0}, "model.gain: expected 5.0, checkpoint has 2.0"),
                                          ({"tau": 20.0}, "model.cell.alpha: expected 0.951")])
def test_checkpoint_of_other_model_settings_is_refused_naming_them(tmp_path, change, named):
    saved = _learner(gain=2.0)
    _train(saved, 3)
    saved.save(tmp_path / "a.npz")
    other = _learner(**change)
    before = _train(other, 2, seed=9)
    with pytest.raises(CheckpointError, match="different model") as e:
        other.restore(tmp_path / "a.npz")
    assert named in str(e.value), str(e.value)
    assert _same(other.state_dict(), before)            # nothing was loaded
    d = CheckpointDir(tmp_path / "dir")                  # a folder of them is not skipped past
    d.save(3, saved.state_dict(), saved.signature())
    with pytest.raises(CheckpointError, match="model.gain|model.cell.alpha"):
        d.latest_good(other.signature())


@pytest.mark.parametrize("saved_kw,restore_kw,named", [
    ({"optimizer": optax.adam(1e-3)}, {"optimizer": optax.adam(1e-2)}, "step_size: expected -0.01, checkpoint has -0.001"),
    ({"clip": 1.0}, {"clip": 2.0}, "max_norm: expected 2.0, checkpoint has 1.0"),
    ({"optimizer": optax.adam(1e-3, b1=0.8)}, {}, "b1: expected 0.9, checkpoint has 0.8"),
])
def test_other_optimizer_settings_restore_with_a_warning(tmp_path, caplog, saved_kw, restore_kw, named):
    saved = _learner(**saved_kw)
    state = _train(saved, 3)
    saved.save(tmp_path / "a.npz")
    other = _learner(**restore_kw)
    caplog.set_level(logging.WARNING, logger="streamtrace.checkpoint")
    header = other.restore(tmp_path / "a.npz")
    assert _same(other.state_dict(), state)
    (warning,) = header["warnings"]
    assert named in warning and "optimizer." in warning, warning
    assert any(named in r.getMessage() for r in caplog.records)


def test_optimizer_change_that_changes_its_state_is_refused_naming_the_settings(tmp_path):
    saved = _learner(optimizer=optax.adam(1e-3))
    saved.save(tmp_path / "a.npz")
    with pytest.raises(CheckpointError, match="different model") as e:
        _learner(optimizer=optax.sgd(1e-3)).restore(tmp_path / "a.npz")
    assert "scale_by_adam.b1: expected '<absent>', checkpoint has 0.9" in str(e.value), str(e.value)


def test_descriptions_of_any_module_and_optimizer():
    # a user's brainstate module (tests/models.py): class names and plain attributes
    desc = describe_model(models.lif_net(n_in=3, n_hidden=5, n_out=2))
    assert desc["class"] == "Stack" and desc["gain"] == 3.0 and desc["cell.class"] == "LIF"
    assert desc["cell.size"] == 5 and desc["cell.v_th"] == 1.0
    assert abs(desc["cell.alpha"] - np.exp(-1 / 5)) < 1e-15         # lif_net: tau = 5
    assert not any(k.endswith((".W", ".b", ".V")) for k in desc)     # weights and states are not settings
    opt = describe_optimizer(optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(0.25, momentum=0.7)))
    assert opt["1.clip_by_global_norm.max_norm"] == 0.5
    assert 0.7 in opt.values() and -0.25 in opt.values(), opt


def test_checkpoint_without_recorded_settings_still_restores(tmp_path):
    """Checkpoints written before settings were recorded load as before."""
    learner = _learner()
    state = _train(learner, 3)
    sig = {k: v for k, v in learner.signature().items() if k not in ("model", "optimizer")}
    write_checkpoint(tmp_path / "old.npz", learner.state_dict(), sig)
    other = _learner(gain=5.0)
    header = other.restore(tmp_path / "old.npz")
    assert _same(other.state_dict(), state) and "warnings" not in header


@pytest.mark.parametrize("other, named", [(dict(horizon=2), "horizon: expected 2"),
                                          (dict(warmup=11), "transform.parts: .*'warmup': 11")],
                         ids=["horizon", "normalise-warmup"])
def test_checkpoint_of_other_quality_settings_is_refused(tmp_path, other, named):
    xs = make_quality_data()
    L = make_quality_learner()
    for t in range(3):
        L.step(xs[t])
    L.save(tmp_path / "a.npz")
    M = make_quality_learner(**other)
    before = snapshot(M)
    with pytest.raises(CheckpointError, match=named):
        M.restore(tmp_path / "a.npz")
    after = snapshot(M)
    for k in before:
        assert np.array_equal(before[k], after[k], equal_nan=True), k




def test_a_checkpoint_of_another_mixture_resumes_all_but_the_mixture_with_a_warning(tmp_path):
    """An older release's mixture (no season) restores into today's learner (a known season):
    every array but the mixture's as saved, the mixture's as a fresh learner's, and a warning."""
    import streamtrace as st

    def make(combine):
        return st.OnlineLearner(st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1), np.zeros(1, np.float32),
                                mode="forecast", combine=combine)
    old = make(st.experts())
    for t in range(25):
        old.step(np.array([np.sin(0.3 * t)], np.float32))
    old.save(tmp_path / "old.npz")
    saved = old.state_dict()
    new = make(st.experts(period=12))
    fresh = new.state_dict()
    with pytest.warns(UserWarning, match="mixture .* of another kind"):
        header = new.restore(tmp_path / "old.npz")
    got = new.state_dict()
    rest = [k for k in got if not k.startswith("combine")]
    mix = [k for k in got if k.startswith("combine")]
    assert rest and mix and len(header["warnings"]) == 1
    assert all(np.array_equal(got[k], saved[k]) for k in rest)
    assert all(np.array_equal(got[k], fresh[k]) for k in mix)
    assert any(not np.array_equal(saved[k], fresh[k]) for k in rest)      # a change the test can see
    other = st.OnlineLearner(st.nn.Stack("gru", n_in=1, n_hidden=5, n_out=1), np.zeros(1, np.float32),
                             mode="forecast", combine=st.experts(period=12))
    before = other.state_dict()
    with pytest.raises(CheckpointError):                                  # another model: refused whole
        other.restore(tmp_path / "old.npz")
    assert all(np.array_equal(other.state_dict()[k], before[k]) for k in before)
