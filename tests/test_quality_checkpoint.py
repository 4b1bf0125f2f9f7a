"""Checkpoints carry all the learning-quality state (normaliser statistics, RLS readouts per
slot, parameter-group optimizer states, the pending forecast and the rolling metrics): a
learner restored in another process continues bit-identically; other settings are refused."""
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from streamtrace.learner import CheckpointError

COMMON = textwrap.dedent('''
    import numpy as np
    import optax
    import streamtrace as st
    from streamtrace import nn

    STEPS, CUT = 60, 30

    def make_learner(horizon=3, warmup=10):
        groups = st.param_groups(recurrent=("W", None), inputs=("W_in", optax.adam(1e-2)),
                                 rest=("*", optax.sgd(1e-2, momentum=0.9)))
        return st.OnlineLearner(nn.Reservoir(2, 12, leak=0.7, seed=5), np.zeros(2, np.float32), slots=2,
                                mode=st.Forecast(channels=(0,), horizon=horizon), optimizer=groups,
                                readout=st.rls(lam=0.99, delta=1e-2),
                                transform=st.chain(st.normalise(warmup=warmup, rate=0.01), st.residual()),
                                window=20)

    def make_data():
        t = np.arange(STEPS)[:, None]
        rng = np.random.default_rng(11)
        level = 40 + 10 * np.sin(0.21 * t + np.array([0.0, 1.0]))      # two streams
        exo = rng.normal(size=(STEPS, 2))
        return np.stack([level, exo], axis=2).astype(np.float32)        # (STEPS, slots, 2)
''')
_ns: dict = {}
exec(COMMON, _ns)
make_learner, make_data = _ns["make_learner"], _ns["make_data"]
STEPS, CUT = _ns["STEPS"], _ns["CUT"]


def snapshot(learner) -> dict:
    return {k: np.array(v, copy=True) for k, v in learner.state_dict().items()}


def test_all_new_state_restores_bit_identically_in_another_process(tmp_path):
    xs = make_data()
    L = make_learner()
    for t in range(CUT):
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
    preds = np.stack([L.step(xs[t]).prediction for t in range(CUT, STEPS)])
    assert preds.shape == (STEPS - CUT, 2, 3, 1)
    final, metrics = snapshot(L), L.stats()["metrics"]

    out = tmp_path / "resumed.npz"
    script = "\n".join([
        COMMON,
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
    env = dict(os.environ, JAX_PLATFORMS=jax.default_backend())
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(out, allow_pickle=False) as z:
        got = {k: z[k] for k in z.files}
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


@pytest.mark.parametrize("other, named", [(dict(horizon=2), "horizon: expected 2"),
                                          (dict(warmup=11), "transform: .*'warmup': 11")],
                         ids=["horizon", "normalise-warmup"])
def test_checkpoint_of_other_quality_settings_is_refused(tmp_path, other, named):
    xs = make_data()
    L = make_learner()
    for t in range(3):
        L.step(xs[t])
    L.save(tmp_path / "a.npz")
    M = make_learner(**other)
    before = snapshot(M)
    with pytest.raises(CheckpointError, match=named):
        M.restore(tmp_path / "a.npz")
    after = snapshot(M)
    for k in before:
        assert np.array_equal(before[k], after[k], equal_nan=True), k


def test_micro_batched_steps_equal_single_steps():
    """step_many (a scan inside one call) carries the same composite state as single steps."""
    xs = make_data()[:24]
    a, b = make_learner(), make_learner()
    singles = np.stack([a.step(x).prediction for x in xs])
    batched = np.concatenate([np.stack([r.prediction for r in b.step_many(xs[i:i + 8])]) for i in range(0, 24, 8)])
    np.testing.assert_allclose(batched, singles, rtol=1e-5, atol=1e-5)
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        np.testing.assert_allclose(sb[k], sa[k], rtol=1e-5, atol=1e-5, err_msg=k)
