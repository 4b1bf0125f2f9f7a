"""Issue 8, items 8 and 9: any damage to a checkpoint file is a CheckpointError (resume logs the
file it skips and falls back to the older good one), and a checkpoint records the model's and
the optimizer's settings: another model's is refused, other optimizer settings are warned about."""
import logging
import struct
import sys
from pathlib import Path

import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace.engine import EngineCore, load_config
from streamtrace.learner import CheckpointDir, CheckpointError, write_checkpoint
from streamtrace.learner.describe import describe_model, describe_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402


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


# ---- item 8: damaged files ------------------------------------------------------------------------
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


# ---- item 9: settings recorded --------------------------------------------------------------------
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
