"""Checkpoint files: damaged, foreign and non-checkpoint files refused (any damage is a
CheckpointError; resume logs the file it skips and falls back to the older good one), the
numbered checkpoint folder and atomic writes, and a pickle-free, readable format."""
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

import numpy as np
import optax
import pytest

from streamtrace.engine import EngineCore, load_config
from streamtrace.learner import CheckpointDir, CheckpointError, read_checkpoint, write_checkpoint
from checkpoint_helpers import (snapshot, assert_same_state, base, learner, _learner, _train, _same,
                                _zip_regions, make_learner, make_data)  # noqa: F401 (fixtures)

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
    readable = re.compile(r"^(params|opt|hidden|traces|stats|rollback)(\.[A-Za-z0-9_]+)+$")
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

