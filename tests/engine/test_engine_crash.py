"""Crashes: the engine process is SIGKILLed mid-stream and restarted with the same config. It
resumes from its newest checkpoint, loses at most checkpoint.every steps, accepts the stream's
next message (a one-time jump ahead), and keeps learning; and no kill, however timed, leaves a
corrupt ``ckpt-*.npz`` behind."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from streamtrace import wire
from streamtrace.transport import SensorClient
from streamtrace.commands.demo import two_tone
from streamtrace.engine.launch import start_engine, stop, write_config
from streamtrace.engine import load_config
from streamtrace.engine.core import EngineCore
from streamtrace import checkpoints as checkpoint_module     # the format alone: numpy only
from streamtrace.learner.checkpoint import CheckpointDir, read_checkpoint
from configs import ipc_sockets  # noqa: E402

RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")


def _workdir():
    return Path(tempfile.mkdtemp(prefix="st-ck-"))     # short: ipc paths are limited to ~100 chars


def _sections(work: Path, ckpt: Path, **changes) -> dict:
    sections = {"model": {"stack": "gru", "n_in": 1, "n_hidden": 16, "n_out": 1},
                "learning": {"mode": "forecast", "lr": 3e-3},
                "engine": {"slots": 2, "micro_batch": 1},
                "sockets": ipc_sockets(work),
                "publish": {"weights_every": 0, "stats_every_s": 3600.0},
                "checkpoint": {"dir": str(ckpt), "every": 200, "keep": 3}}
    for section, values in changes.items():
        sections[section] = {**sections[section], **values}
    return sections


def _kill(proc):
    proc.kill()                                   # SIGKILL: no handler, no final checkpoint
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    proc.stdout.close()


def _start(config, capsys):
    """Start the engine; returns (proc, (checkpoint path, step) it resumed from, or None)."""
    capsys.readouterr()
    proc = start_engine(config)                   # echoes the lines before "listening" to stderr
    found = RESUMED.search(capsys.readouterr().err)
    return proc, (None if found is None else (Path(found.group(1)), int(found.group(2))))


def _assert_no_corrupt_checkpoint(folder: Path):
    """Every ckpt-*.npz reads back with a matching checksum, and the newest is the latest good
    one; anything else in the folder is a hidden temporary file (left by a kill inside a write).
    Returns (path, header, names of the temporary files)."""
    files = CheckpointDir(folder).paths()
    assert files, "no checkpoint at all"
    for f in files:
        read_checkpoint(f)                        # raises CheckpointError if unreadable or corrupt
    path, _, header, errors = CheckpointDir(folder).latest_good()
    assert path == files[-1] and errors == []
    others = [p.name for p in folder.iterdir() if p not in files]
    assert all(n.startswith(".ckpt-") and n.endswith(".tmp") for n in others), others
    return path, header, set(others)


# ---- 3. kill -9 mid-stream, restart, continue ---------------------------------------------------
@pytest.mark.slow
def test_sigkill_mid_stream_resumes_from_the_last_checkpoint_and_keeps_learning(capsys):
    EVERY, KILL_AT, IN_FLIGHT, AFTER = 200, 700, 20, 400
    work = _workdir()
    ckpt = work / "ckpt"
    sections = _sections(work, ckpt, checkpoint={"every": EVERY})
    config = write_config(work / "engine.toml", sections)
    router = sections["sockets"]["router"]
    sig = two_tone(0, KILL_AT + IN_FLIGHT + AFTER + 1)
    losses = np.full(len(sig), np.nan)
    proc = None
    try:
        proc, resumed = _start(config, capsys)
        assert resumed is None                    # an empty folder: a fresh start
        with SensorClient(router, stream="sine", timeout_s=30) as c:
            for t in range(KILL_AT):
                r = c.step(sig[t:t + 1])
                assert (r["seq"], r["step"]) == (t, t + 1)
                losses[t] = np.nan if r["loss"] is None else r["loss"]
            for t in range(KILL_AT, KILL_AT + IN_FLIGHT):   # still in flight when the engine dies
                c.send(sig[t:t + 1])
            _kill(proc)

        path, header, _ = _assert_no_corrupt_checkpoint(ckpt)
        saved = header["extra"]["steps"]
        assert KILL_AT - EVERY <= saved <= KILL_AT + IN_FLIGHT, saved     # at most `every` steps lost
        kept = work / "kept"                     # the checkpoint it must resume from, kept aside
        kept.mkdir()
        shutil.copy2(path, kept / path.name)

        proc, resumed = _start(config, capsys)
        assert resumed == (path, saved)
        nxt = KILL_AT + IN_FLIGHT                # the client carries on with its own next seq
        with SensorClient(router, stream="sine", start_seq=nxt, timeout_s=30) as c:
            first = c.step(sig[nxt:nxt + 1])     # jumps ahead of the checkpoint: accepted once
            assert (first["type"], first["seq"], first["step"]) == ("prediction", nxt, saved + 1)
            for t in range(nxt + 1, nxt + AFTER):
                r = c.step(sig[t:t + 1])
                assert (r["seq"], r["step"]) == (t, saved + 1 + t - nxt)
                losses[t] = r["loss"]
            # a jump is allowed once per restart only: skipping ahead again is a gap
            c.send(sig[:1], seq=nxt + AFTER + 5)
            assert c.recv(raise_errors=False)["code"] == "gap"
        stop(proc)
        assert proc.returncode == 0              # SIGTERM: a clean stop with a final checkpoint
        assert CheckpointDir(ckpt).latest_good()[2]["extra"]["steps"] == saved + AFTER
        proc = None
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    # it resumed from exactly that state: the same first prediction as the checkpoint gives here
    ref = EngineCore(load_config(None, _sections(work, kept, checkpoint={"every": EVERY})))
    assert ref.resume()["extra"]["steps"] == saved
    assert ref.ingest(wire.data_message("sine", nxt, sig[nxt:nxt + 1]), b"o") == []
    want = wire.decode(ref.tick()[0][2])
    np.testing.assert_allclose(wire.unpack_array(want["pred"]), first["pred"], rtol=1e-6, atol=1e-7)
    assert want["step"] == first["step"]

    fresh = np.nanmean(losses[:100])             # a new model on this signal
    before = np.nanmean(losses[KILL_AT - 100:KILL_AT])
    after_start = np.nanmean(losses[nxt + 1:nxt + 101])
    after_end = np.nanmean(losses[nxt + AFTER - 100:nxt + AFTER])
    assert before < 0.5 * fresh, (fresh, before)
    assert after_start < 0.5 * fresh, (fresh, after_start)          # not starting over
    assert after_end < 0.5 * fresh and after_end <= 1.5 * before + 1e-3, (before, after_end)
    shutil.rmtree(work, ignore_errors=True)


# ---- 4. a kill during a checkpoint write never leaves a corrupt checkpoint -----------------------
def _complete(folder: Path) -> set:
    """The names of the finished checkpoints in `folder`."""
    try:
        return {n for n in os.listdir(folder) if CheckpointDir.PATTERN.match(n)}
    except FileNotFoundError:
        return set()


def _kill_inside_a_write(proc, folder: Path, delay: float, window: float, done: threading.Event,
                         old: set, saved: set):
    """Once a checkpoint not in `saved` is complete (the round made progress, however loaded
    the machine) and `delay` s later, SIGKILL the engine the moment a checkpoint is being written
    (a new temporary file exists, not one of the `old` leftovers), or `window` s later at the
    latest (0: at once, a random time)."""
    give_up = time.monotonic() + 60.0
    while time.monotonic() < give_up and not (_complete(folder) - saved):
        time.sleep(0.005)
    not_before = time.monotonic() + delay
    deadline = not_before + window
    while time.monotonic() < not_before:
        time.sleep(0.005)
    while time.monotonic() < deadline:      # deadline == not_before: a kill at a random time
        try:
            if any(n.startswith(".ckpt-") and n not in old for n in os.listdir(folder)):
                break
        except FileNotFoundError:
            pass
    proc.kill()
    done.set()


@pytest.mark.slow
def test_sigkill_at_random_times_with_frequent_checkpoints_never_leaves_a_corrupt_one(capsys):
    work = _workdir()
    ckpt = work / "ckpt"
    # a bigger model and a checkpoint every 5 steps: checkpoints of ~3 MB, written all the time
    sections = _sections(work, ckpt, model={"n_hidden": 128}, engine={"slots": 4},
                         checkpoint={"every": 5, "keep": 3})
    config = write_config(work / "engine.toml", sections)
    router = sections["sockets"]["router"]
    rng = np.random.default_rng(2024)
    seq, last, inside, tmp = 0, None, 0, set()
    proc = None
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)     # the killer thread must not wait ~5 ms for the GIL: it would miss writes
    try:
        for round_ in range(6):
            proc, resumed = _start(config, capsys)
            if last is None:
                assert resumed is None
            else:                                 # it resumes from the newest checkpoint there
                assert resumed == last, (round_, resumed, last)
            # odd rounds: killed at a random time; even rounds: at the first write after a random
            # time; timed from the first answer (on a loaded machine a restart may take seconds)
            killed, killer = threading.Event(), None
            with SensorClient(router, stream="load", start_seq=seq, timeout_s=30) as c:
                outstanding = 0
                while not killed.is_set():        # 16 steps always queued: the engine never idles
                    while outstanding < 16:
                        c.send(rng.normal(size=1).astype(np.float32))
                        outstanding += 1
                    try:
                        r = c.recv()
                    except TimeoutError:
                        if killed.is_set():
                            break
                        continue                  # slow, not killed (a loaded machine): wait on
                    outstanding -= 1
                    assert r["type"] == "prediction"
                    if killer is None:
                        window = 2.0 if round_ % 2 == 0 else 0.0
                        killer = threading.Thread(target=_kill_inside_a_write,
                                                  args=(proc, ckpt, rng.uniform(0.2, 0.8), window, killed, tmp,
                                                        _complete(ckpt)))
                        killer.start()
                        c.timeout_ms = 500        # from now on a silence is the kill
                seq = c.seq
            assert killer is not None, "the engine never answered"
            killer.join()
            _kill(proc)
            proc = None
            path, header, tmp_now = _assert_no_corrupt_checkpoint(ckpt)
            step = header["extra"]["steps"]
            assert last is None or step > last[1]     # progress in every round
            last, inside, tmp = (path, step), inside + bool(tmp_now - tmp), tmp_now
        # the last kill: what the next start would resume from (the same code path) is good
        assert CheckpointDir(ckpt).latest_good()[0] == last[0]
        assert inside >= 1, "no kill landed inside a checkpoint write"
    finally:
        sys.setswitchinterval(switch)
        if proc is not None:
            stop(proc)
    shutil.rmtree(work, ignore_errors=True)


WRITER = textwrap.dedent('''
    import importlib, sys
    import numpy as np
    m = importlib.import_module(sys.argv[1])     # the runner's checkpoint format: no jax, a fast start
    folder, step = m.CheckpointDir(sys.argv[2], keep=3), int(sys.argv[3])
    arrays = {"w": np.random.default_rng(step).normal(size=1 << 19).astype(np.float32), "n": np.zeros(1)}
    print("ready", flush=True)
    while True:
        step += 1
        arrays["n"][0] = step
        folder.save(step, arrays, {"model": "kill-test"}, {"steps": step})
''')


@pytest.mark.slow
def test_sigkill_of_a_process_saving_checkpoints_in_a_loop_never_corrupts_one(tmp_path):
    """The same as above at a much higher rate: a process that only writes ~2 MB checkpoints
    back to back (CheckpointDir.save), killed at random moments 25 times, and on (60 at most)
    until at least 3 kills have landed inside a write (about half of them do; a loaded machine
    writes slower and may land fewer)."""
    folder = tmp_path / "ckpt"
    rng = np.random.default_rng(7)
    step, inside, tmp, kills = 0, 0, set(), 0
    while kills < 25 or (inside < 3 and kills < 60):
        kills += 1
        proc = subprocess.Popen([sys.executable, "-c", WRITER, checkpoint_module.__name__, str(folder), str(step)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.3))
        proc.kill()
        proc.wait()
        proc.stdout.close()
        path, header, tmp_now = _assert_no_corrupt_checkpoint(folder)
        arrays, _ = read_checkpoint(path)
        assert arrays["n"][0] == header["extra"]["steps"] > step
        step, inside, tmp = header["extra"]["steps"], inside + bool(tmp_now - tmp), tmp_now
    assert inside >= 3, "hardly any kill landed inside a write: the test did not test much"


# ---- the stream position a checkpoint records ---------------------------------------------------
def test_checkpoint_records_the_stream_position_of_its_learner_state(tmp_path):
    sections = {"model": {"stack": "gru", "n_hidden": 4}, "engine": {"slots": 1, "micro_batch": 1},
                "publish": {"weights_every": 0}, "checkpoint": {"dir": str(tmp_path), "every": 5}}
    core = EngineCore(load_config(None, sections))
    xs = np.sin(np.arange(13, dtype=np.float32))[:, None]
    for i in range(12):
        assert core.ingest(wire.data_message("s", i, xs[i]), b"o") == []
        core.tick()
    _, _, header, _ = CheckpointDir(tmp_path).latest_good()
    steps = header["extra"]["steps"]            # the messages seq 0 .. steps-1 are in this state
    resumed = EngineCore(load_config(None, sections))
    resumed.resume()
    assert resumed.ingest(wire.data_message("s", 12, xs[12]), b"o") == []
    lost = resumed.metrics.counters["lost_on_resync"]
    assert (header["extra"]["streams"]["s"]["next_seq"], lost) == (steps, 12 - steps)
