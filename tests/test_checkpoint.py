"""Checkpoints: exact resume (also in a fresh process), with all the learning-quality state
(normaliser statistics, RLS readouts per slot, parameter-group optimizer states, the pending
forecast and the rolling metrics); refusal of damaged or foreign files (any damage is a
CheckpointError; resume logs the file it skips and falls back to the older good one); the
model's and the optimizer's settings recorded (another model's refused, other optimizer settings
warned about); atomic writes, the numbered checkpoint folder, and a pickle-free, readable format."""
import errno
import json
import logging
import os
import re
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace.engine import EngineCore, load_config
from streamtrace.learner import CheckpointDir, CheckpointError, read_checkpoint, write_checkpoint
from streamtrace.learner.describe import describe_model, describe_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402

TESTS_DIR = Path(__file__).resolve().parent

# The learner and the data, shared verbatim by this process and the fresh one.
COMMON = textwrap.dedent('''
    import numpy as np
    import optax
    import streamtrace as st
    from streamtrace import nn
    from models import CellNet

    N_IN, N_HIDDEN, N_OUT, STEPS, CUT = 3, 6, 2, 100, 50

    def make_learner(n_hidden=N_HIDDEN, algorithm="d-rtrl", optimizer=None, **kw):
        model = CellNet(nn.GRUCell, n_in=N_IN, n_hidden=n_hidden, n_out=N_OUT, seed=0)
        return st.OnlineLearner(model, np.zeros(N_IN, np.float32), algorithm=algorithm,
                                optimizer=optax.adam(1e-2) if optimizer is None else optimizer, **kw)

    def make_data(steps=STEPS, n_in=N_IN, n_out=N_OUT):
        rng = np.random.default_rng(1234)
        xs = rng.normal(size=(steps, n_in)).astype(np.float32)
        t = np.arange(steps, dtype=np.float32)[:, None]
        ys = np.sin(0.3 * t + np.arange(n_out, dtype=np.float32)).astype(np.float32)
        return xs, ys
''')
_ns: dict = {}
exec(COMMON, _ns)
make_learner, make_data = _ns["make_learner"], _ns["make_data"]
STEPS, CUT, N_IN = _ns["STEPS"], _ns["CUT"], _ns["N_IN"]


def snapshot(learner) -> dict:
    return {k: np.array(v, copy=True) for k, v in learner.state_dict().items()}


def assert_same_state(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert np.array_equal(a[k], b[k], equal_nan=True), f"state '{k}' differs"


@pytest.fixture(scope="module")
def base():
    """A learner trained 20 steps (tests reset it to this state before use) and its state."""
    learner = make_learner()
    xs, ys = make_data()
    for t in range(20):
        learner.step(xs[t], ys[t])
    return learner, snapshot(learner)


@pytest.fixture
def learner(base):
    L, state = base
    L.load_state_dict(state)
    return L


# The learning-quality learner (normaliser, RLS readout, parameter groups, multi-step forecast)
# and its data, shared verbatim by this process and the fresh one.
QUALITY_COMMON = textwrap.dedent('''
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
_qns: dict = {}
exec(QUALITY_COMMON, _qns)
make_quality_learner, make_quality_data = _qns["make_learner"], _qns["make_data"]
Q_STEPS, Q_CUT = _qns["STEPS"], _qns["CUT"]


# A small LIF learner for the damage and recorded-settings tests.
def _learner(gain=2.0, optimizer=None, clip=None, tau=None):
    model = st.nn.Stack("lif", 2, 4, 2, gain=gain)
    if tau is not None:
        model.cell = st.nn.LIF(4, tau=tau)
    return st.OnlineLearner(model, np.zeros(2, np.float32), mode="supervised", clip=clip,
                            optimizer=optimizer or optax.adam(1e-3))


def _train(learner, steps, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        learner.step(rng.normal(size=2).astype(np.float32), rng.normal(size=2).astype(np.float32))
    return {k: np.array(v, copy=True) for k, v in learner.state_dict().items()}


def _same(a, b):
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def _zip_regions(raw: bytes):
    """(local headers + data, central directory, end record) byte ranges of a zip file."""
    eocd = raw.rfind(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack("<II", raw[eocd + 12:eocd + 20])
    assert cd_offset + cd_size == eocd
    return range(0, cd_offset), range(cd_offset, eocd), range(eocd, len(raw))


# ---- 1. exact resume -------------------------------------------------------------------

def run_in_fresh_process(script: str, out, tmp_path) -> dict:
    """Run ``script`` in a new Python process (nothing shared with this one but the files) and
    return the arrays it saved to ``out``."""
    env = dict(os.environ, JAX_PLATFORMS=jax.default_backend())
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(out, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}

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


# ---- 2. damaged, foreign and non-checkpoint files ---------------------------------------
def _member_data_span(path, member):
    """(offset, length) of the raw array bytes of ``member`` (a stored .npy) inside the zip."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member + ".npy")
        assert info.compress_type == zipfile.ZIP_STORED
    raw = Path(path).read_bytes()
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    return start, info.file_size


def _refuses(learner, path, pattern):
    before = snapshot(learner)
    with pytest.raises(CheckpointError) as exc:
        learner.restore(path)
    msg = str(exc.value)
    assert re.search(pattern, msg, re.I), msg
    assert_same_state(snapshot(learner), before)
    return msg


@pytest.mark.parametrize("keep", [0.5, 0.9, -1], ids=["half", "90pc", "last-byte-cut"])
def test_truncated_checkpoint_is_refused_and_state_kept(learner, tmp_path, keep):
    good = tmp_path / "good.npz"
    learner.save(good)
    data = good.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[:int(len(data) * keep)] if keep > 0 else data[:keep])
    xs, ys = make_data()
    learner.step(xs[30], ys[30])          # the learner has moved on from the saved state
    msg = _refuses(learner, cut, r"truncated|unreadable")
    assert str(cut) in msg


def test_corrupted_array_bytes_are_refused_and_state_kept(learner, tmp_path):
    good = tmp_path / "good.npz"
    learner.save(good)
    start, size = _member_data_span(good, "params.cell.z.W")
    nbytes = learner.state_dict()["params.cell.z.W"].nbytes
    data = bytearray(good.read_bytes())
    mid = start + size - nbytes + nbytes // 2          # middle of the array's raw data
    for i in range(mid, mid + 4):
        data[i] ^= 0x5A
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(data))
    learner.step(*[a[30] for a in make_data()])
    msg = _refuses(learner, bad, r"CRC|checksum|corrupt")
    assert "params.cell.z.W" in msg or "checksum" in msg


def test_consistent_zip_with_altered_array_fails_the_checksum(learner, tmp_path):
    """A rewritten file whose zip is intact (valid CRCs) but whose arrays differ from the
    ones the header's sha256 covers."""
    good = tmp_path / "good.npz"
    learner.save(good)
    with np.load(good, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    members["params.out.b"] = members["params.out.b"] + np.float32(1e-3)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **members)
    _refuses(learner, bad, r"checksum mismatch.*corrupted")


def test_header_with_other_format_version_is_refused(learner, tmp_path):
    good = tmp_path / "good.npz"
    learner.save(good)
    with np.load(good, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    header = json.loads(bytes(members["__meta__"]).decode())
    header["version"] = 99
    members["__meta__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    bad = tmp_path / "v99.npz"
    np.savez(bad, **members)
    _refuses(learner, bad, r"unsupported checkpoint format.*99")


@pytest.mark.parametrize("kind", ["random-bytes", "plain-npz", "empty", "missing", "text"])
def test_non_checkpoint_files_are_refused(learner, tmp_path, kind):
    path = tmp_path / "not_a_checkpoint.npz"
    if kind == "random-bytes":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    elif kind == "plain-npz":       # the right arrays, but no header
        np.savez(path, **learner.state_dict())
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text(json.dumps({"format": "streamtrace-checkpoint", "version": 1}))
    pattern = {"plain-npz": r"not a streamtrace checkpoint \(no header\)"}.get(kind, r"unreadable")
    _refuses(learner, path, pattern)


def test_plain_npy_file_is_refused_with_checkpoint_error(learner, tmp_path):
    path = tmp_path / "array.npy"
    np.save(path, np.arange(10, dtype=np.float32))
    _refuses(learner, path, r"not a streamtrace checkpoint|unreadable")


def test_checkpoint_of_other_hidden_size_is_refused_naming_the_difference(learner, tmp_path):
    path = tmp_path / "h6.npz"
    learner.save(path)
    other = make_learner(n_hidden=8)
    msg = _refuses(other, path, r"different model")
    # the hidden state's shape is named with both sizes
    assert "hidden.cell.h" in msg and "[1, 8]" in msg and "[1, 6]" in msg, msg


def test_checkpoint_of_other_algorithm_is_refused_naming_the_difference(learner, tmp_path):
    path = tmp_path / "d_rtrl.npz"
    learner.save(path)
    other = make_learner(algorithm="es-d-rtrl")
    msg = _refuses(other, path, r"different model")
    assert re.search(r"algorithm: expected 'es-d-rtrl', checkpoint has 'd-rtrl'", msg), msg
    # and the other way round
    path2 = tmp_path / "es.npz"
    other.save(path2)
    msg2 = _refuses(learner, path2, r"different model")
    assert re.search(r"algorithm: expected 'd-rtrl', checkpoint has 'es-d-rtrl'", msg2), msg2


def test_checkpoint_of_other_optimizer_state_is_refused(learner, tmp_path):
    path = tmp_path / "adam.npz"
    learner.save(path)
    other = make_learner(optimizer=optax.sgd(0.1))
    msg = _refuses(other, path, r"different model")
    assert "opt.0.mu" in msg, msg          # adam's moments are not state of plain SGD


def test_a_flipped_byte_anywhere_falls_back_to_the_older_checkpoint(tmp_path):
    learner = _learner()
    d = CheckpointDir(tmp_path, keep=2)
    states = {}
    for step in (10, 20):
        states[step] = _train(learner, 10, seed=step)
        d.save(step, learner.state_dict(), learner.signature(), {"steps": step})
    older, newest = d.paths()
    good = newest.read_bytes()
    data, central, end = _zip_regions(good)
    # every byte of the end record, a sample of the others (strides prime to the 30-byte
    # local and 46-byte central headers, so every field of them is hit somewhere)
    offsets = {"data": list(data)[::37], "central directory": list(central)[::9], "end record": list(end)}
    fell_back = {region: 0 for region in offsets}
    kinds = set()
    for region, where in offsets.items():
        for i in where:
            bad = bytearray(good)
            bad[i] ^= 0xFF
            newest.write_bytes(bytes(bad))
            path, arrays, header, errors = d.latest_good(learner.signature())   # never raises
            if path == newest:        # a byte zipfile does not use (a timestamp, "made by")
                assert errors == [] and _same(arrays, states[20]), (region, i)
            else:
                assert path == older and _same(arrays, states[10]) and header["extra"] == {"steps": 10}, (region, i)
                assert len(errors) == 1 and newest.name in errors[0], (region, i, errors)
                kinds.add(errors[0].split("(")[-1].split(":")[0])
                fell_back[region] += 1
    newest.write_bytes(good)
    # most damage is detected, in every region (what is not is a byte zipfile ignores, e.g. a
    # local header's timestamp, and then the arrays read back exact); many exception kinds
    # were turned into one
    assert fell_back["data"] > 0.7 * len(offsets["data"]), fell_back
    assert fell_back["central directory"] > 0.5 * len(offsets["central directory"]), fell_back
    assert fell_back["end record"] > 0, fell_back
    assert len(kinds) >= 3, kinds


def test_resume_logs_the_skipped_file_and_takes_the_older_one(tmp_path, caplog):
    cfg = load_config(None, {"model": {"stack": "gru", "n_hidden": 3}, "engine": {"slots": 1, "micro_batch": 1},
                             "checkpoint": {"dir": str(tmp_path)}})
    core = EngineCore(cfg)
    for steps in (5, 9):
        core.steps = steps
        core.save_checkpoint()
    older, newest = CheckpointDir(tmp_path).paths()
    raw = bytearray(newest.read_bytes())
    _, central, _ = _zip_regions(bytes(raw))
    # the compression method of the first central directory entry: zipfile raises
    # NotImplementedError for a method it does not know
    assert raw[central.start:central.start + 4] == b"PK\x01\x02"
    raw[central.start + 10:central.start + 12] = struct.pack("<H", 99)
    newest.write_bytes(bytes(raw))
    caplog.set_level(logging.WARNING, logger="streamtrace.checkpoint")
    resumed = core.resume()
    assert resumed["path"] == str(older) and core.steps == 5
    lines = [r.getMessage() for r in caplog.records if r.name == "streamtrace.checkpoint"]
    assert len(lines) == 1 and newest.name in lines[0] and "NotImplementedError" in lines[0], lines


def test_header_that_is_not_a_json_object_is_a_checkpoint_error(tmp_path):
    learner = _learner()
    path = tmp_path / "odd.npz"
    np.savez(path, __meta__=np.frombuffer(b"[1, 2]", np.uint8))
    with pytest.raises(CheckpointError, match="not a JSON object"):
        learner.restore(path)


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
                                          (dict(warmup=11), "transform: .*'warmup': 11")],
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


# ---- 4. the checkpoint folder and atomic writes -----------------------------------------
def _states_every(learner, d: CheckpointDir, steps):
    xs, ys = make_data()
    states, t = {}, 20
    for s in steps:
        while t < s:
            learner.step(xs[t], ys[t])
            t += 1
        d.save(s, learner.state_dict(), learner.signature(), extra={"step": s})
        states[s] = snapshot(learner)
    return states


def test_checkpoint_dir_keeps_newest_and_falls_back_past_a_corrupt_one(learner, tmp_path):
    d = CheckpointDir(tmp_path / "ckpts", keep=3)
    states = _states_every(learner, d, [25, 30, 35, 40, 45])
    assert [p.name for p in d.paths()] == [f"ckpt-{s:012d}.npz" for s in (35, 40, 45)]
    assert sorted(os.listdir(d.folder)) == [p.name for p in d.paths()]   # nothing else left

    path, arrays, header, errors = d.latest_good(learner.signature())
    assert path == d.paths()[-1] and errors == [] and header["extra"] == {"step": 45}
    assert_same_state(arrays, states[45])

    newest = d.paths()[-1]
    start, size = _member_data_span(newest, "params.out.W")
    data = bytearray(newest.read_bytes())
    data[start + size - 8] ^= 0xFF
    newest.write_bytes(bytes(data))

    path, arrays, header, errors = d.latest_good(learner.signature())
    assert path.name == f"ckpt-{40:012d}.npz"
    assert header["extra"] == {"step": 40}
    assert_same_state(arrays, states[40])
    assert len(errors) == 1 and newest.name in errors[0] and re.search(r"CRC|checksum", errors[0])
    # the learner resumes from it
    learner.restore(path)
    assert_same_state(snapshot(learner), states[40])
    assert learner.stats()["step"] == 40

    # every one unreadable: nothing good, every error reported
    for p in d.paths():
        p.write_bytes(p.read_bytes()[:100])
    assert d.latest_good(learner.signature())[:3] == (None, None, None)
    assert len(d.latest_good()[3]) == 3


def test_checkpoint_dir_signature_mismatch_raises(learner, tmp_path):
    d = CheckpointDir(tmp_path, keep=2)
    d.save(1, learner.state_dict(), learner.signature())
    sig = dict(learner.signature(), algorithm="rtrl")
    with pytest.raises(CheckpointError, match=r"different model.*algorithm"):
        d.latest_good(sig)


def test_checkpoint_dir_does_not_delete_the_checkpoint_it_just_wrote(learner, tmp_path):
    d = CheckpointDir(tmp_path, keep=1)
    d.save(50, learner.state_dict(), learner.signature())
    d.paths()[-1].write_bytes(b"garbage")              # the only checkpoint is damaged
    assert d.latest_good(learner.signature())[0] is None
    # start over: the first new checkpoint must survive
    path = d.save(10, learner.state_dict(), learner.signature())
    assert path.exists()
    assert d.latest_good(learner.signature())[0] == path


def _boom_write(real_fdopen):
    class HalfWriter:
        """A file whose write puts half the bytes on disk, then fails (disk full)."""
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, b):
            self.f.write(bytes(b)[:len(b) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            self.f.flush()

        def fileno(self):
            return self.f.fileno()
    return lambda fd, *a, **k: HalfWriter(real_fdopen(fd, *a, **k))


@pytest.mark.parametrize("where,exc", [("write", OSError), ("fsync", OSError), ("replace", OSError),
                                       ("fsync", KeyboardInterrupt)])
def test_crash_during_write_keeps_previous_checkpoint(learner, tmp_path, monkeypatch, where, exc):
    target = tmp_path / "model.npz"
    learner.save(target, extra={"which": "old"})
    old_bytes, old_state = target.read_bytes(), snapshot(learner)
    learner.step(*[a[30] for a in make_data()])
    new_state = snapshot(learner)
    seen = {}

    def fail(*args, **kw):
        # at the moment of the crash the new data lives in a temp file beside the target
        seen["listing"] = sorted(os.listdir(tmp_path))
        seen["target"] = target.read_bytes()
        raise exc("simulated crash") if exc is KeyboardInterrupt else exc(errno.EIO, "simulated crash")

    with monkeypatch.context() as m:
        if where == "write":
            m.setattr(os, "fdopen", _boom_write(os.fdopen))
        else:
            m.setattr(os, where, fail)
        with pytest.raises(exc):
            learner.save(target, extra={"which": "new"})
    if where != "write":
        assert seen["target"] == old_bytes
        tmp = [n for n in seen["listing"] if n != target.name]
        assert len(tmp) == 1 and tmp[0].startswith(".model.npz.") and tmp[0].endswith(".tmp")
    assert os.listdir(tmp_path) == [target.name]        # no temp file left behind
    assert target.read_bytes() == old_bytes
    arrays, header = read_checkpoint(target, expect_signature=learner.signature())
    assert header["extra"] == {"which": "old"}
    assert_same_state(arrays, old_state)

    # once the fault is gone the same call succeeds and replaces the file
    learner.save(target, extra={"which": "new"})
    arrays, header = read_checkpoint(target, expect_signature=learner.signature())
    assert header["extra"] == {"which": "new"}
    assert_same_state(arrays, new_state)
    assert os.listdir(tmp_path) == [target.name]


def test_hard_kill_mid_write_leaves_previous_checkpoint_usable(tmp_path):
    """A process killed between writing the temp file and renaming it (no cleanup can run):
    the real name still holds the previous checkpoint and the leftover temp is ignored."""
    folder = tmp_path / "ckpts"
    script = textwrap.dedent(f'''
        import os
        import numpy as np
        from streamtrace.learner.checkpoint import CheckpointDir
        d = CheckpointDir({str(folder)!r}, keep=3)
        sig = {{"algorithm": "test"}}
        d.save(1, {{"params.w": np.arange(6, dtype=np.float32)}}, sig)
        os.fsync = lambda fd: os._exit(3)
        d.save(2, {{"params.w": np.ones(6, np.float32)}}, sig)
    ''')
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    names = sorted(os.listdir(folder))
    assert "ckpt-000000000001.npz" in names and "ckpt-000000000002.npz" not in names
    assert any(n.startswith(".ckpt-000000000002.npz.") and n.endswith(".tmp") for n in names)
    d = CheckpointDir(folder, keep=3)
    assert [p.name for p in d.paths()] == ["ckpt-000000000001.npz"]
    path, arrays, header, errors = d.latest_good({"algorithm": "test"})
    assert path.name == "ckpt-000000000001.npz" and errors == []
    assert np.array_equal(arrays["params.w"], np.arange(6, dtype=np.float32))


def test_write_checkpoint_refuses_reserved_name(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        write_checkpoint(tmp_path / "x.npz", {"__meta__": np.zeros(1)}, {})
    assert not os.listdir(tmp_path)


# ---- 5. the file format: no pickle, readable names --------------------------------------
def test_checkpoint_file_has_no_pickle_and_readable_names(learner, tmp_path):
    path = tmp_path / "c.npz"
    learner.save(path, extra={"run": "a"})
    state = learner.state_dict()
    with zipfile.ZipFile(path) as zf:
        members = zf.namelist()
        assert all(n.endswith(".npy") for n in members)
        for n in members:                                # every member is a plain .npy array
            with zf.open(n) as f:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(f)
                assert not dtype.hasobject, n
    with np.load(path, allow_pickle=False) as z:
        names = list(z.files)
        loaded = {n: z[n] for n in names}               # reading every member needs no pickle
    assert set(names) == set(state) | {"__meta__"}
    readable = re.compile(r"^(params|opt|hidden|traces|stats)(\.[A-Za-z0-9_]+)+$")
    for n in names:
        assert n == "__meta__" or readable.match(n), n
    for want in ("params.cell.z.W", "params.cell.z.b", "params.out.W", "hidden.cell.h",
                 "stats.counters", "opt.0.count", "opt.0.mu.cell.z.W", "opt.0.nu.out.b"):
        assert want in names
    assert any(n.startswith("traces.") for n in names)
    for n, v in state.items():
        assert loaded[n].dtype == v.dtype and np.array_equal(loaded[n], v), n
    assert np.array_equal(loaded["params.cell.z.W"], learner.params["cell.z.W"])
    header = json.loads(bytes(loaded["__meta__"]).decode("utf-8"))
    assert header["format"] == "streamtrace-checkpoint" and header["version"] == 1
    assert header["extra"] == {"run": "a"}
    assert header["signature"] == json.loads(json.dumps(learner.signature()))
    assert re.fullmatch(r"[0-9a-f]{64}", header["sha256"])
