"""The jax-free runner replying first (``serve``'s engine.reply_first; the runner's
``--no-reply-first`` turns it off): where the prediction does not depend on the step's update
(supervised; forecast with learning.forecast_before_update) a data message given a sender is
answered from the exported prediction twin, and the step runs after the reply has left.
Oracles: the state before the step (the reply leaves while the state is still that one; its
prediction is the twin's from that state), the runner without reply-first on the same messages
(the same state after, bit for bit; replies within float32 rounding: two modules compiled
apart), and ``serve``'s engine core replying first (slow: it compiles)."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from streamtrace import wire
from streamtrace.engine.launch import write_config
from streamtrace.export.write import export_learner
from streamtrace_runner.bank import RunnerBank
from streamtrace_runner.core import Options, RunnerCore
from streamtrace_runner.runtime import Runner

N_IN, N_OUT, SLOTS, T = 2, 2, 2, 40
GRU = {"model": {"stack": "gru", "n_in": N_IN, "n_hidden": 4, "n_out": N_OUT},
       "learning": {"mode": "supervised", "optimizer": "sgd", "lr": 0.05}}
F32 = 1e-5      # float32: the twin and the step are compiled apart (their sums in another order)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reply-first")
    write_config(tmp / "gru.toml", GRU)
    export_learner(tmp / "gru.toml", tmp / "out")
    return tmp / "out"


def _core(folder, **options):
    return RunnerCore(RunnerBank(Runner(folder), SLOTS), Options(slots=SLOTS, weights_every=0, **options))


def _messages(n=T, seed=0):
    """Two streams interleaved, supervised, a few steps without learning (mode "predict")."""
    rng = np.random.default_rng(seed)
    out, seqs = [], {}
    for t in range(n):
        s = f"s{t % 3 % 2}"
        seq = seqs[s] = seqs.get(s, -1) + 1
        x, y = rng.normal(size=N_IN).astype(np.float32), rng.normal(size=N_OUT).astype(np.float32)
        learn = t % 7 != 3
        out.append((s, wire.data_message(s, seq, x, y, mode=None if learn else "predict"), x, y, learn))
    return out


def _reply(outs):
    [raw] = [raw for kind, _, raw in outs if kind == "reply"]
    return wire.decode(raw)


def _pred(reply):
    return wire.unpack_array(reply["pred"])


def test_replies_leave_from_the_twin_before_the_step(folder):
    """Each reply is sent while the stream's state is still the one before its step (the step
    not counted yet); its prediction and loss are the twin's from that state; then the step
    runs: the state after equals the runner's without reply-first, bit for bit, and its replies
    agree within float32 rounding."""
    core, plain, oracle = _core(folder), _core(folder, reply_first=False), Runner(folder)
    assert core.reply_first and not plain.reply_first
    learn = np.ones(1, bool)
    for s, raw, x, y, learns in _messages():
        slot = core.streams[s].slot if s in core.streams else len(core.streams)
        before = core.bank.slot_state(slot)
        seen = []

        def send(outs):
            now = core.bank.slot_state(slot)
            seen.append((outs, core.steps, all(np.array_equal(now[k], before[k]) for k in before)))
        steps = core.steps
        assert core.ingest(raw, b"o", send) == [] and core.replied_first
        [(outs, steps_then, unchanged)] = seen
        assert unchanged and steps_then == steps and core.steps == steps + 1
        got, want = _reply(outs), _reply(plain.ingest(raw, b"o"))
        assert [k for k, _, _ in outs] == ["pub", "reply"] and got["step"] == want["step"] == steps + 1
        oracle.buffers = oracle.device_buffers(before)
        learn[0] = learns
        twin, loss, applied = oracle.predict(x[None], y[None], learn=learn)
        loss = float(loss[0])
        assert np.array_equal(_pred(got), twin[0]) and got["loss"] == (loss if learns else None) and not applied
        np.testing.assert_allclose(_pred(got), _pred(want), rtol=F32, atol=F32)
        if learns:      # (a step that does not learn reports no loss: None, as serve's)
            np.testing.assert_allclose(got["loss"], want["loss"], rtol=F32)
        else:
            assert want["loss"] is None
    a, b = core.bank.state_dict(), plain.bank.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    initial = RunnerBank(Runner(folder), SLOTS).state_dict()
    assert any(not np.array_equal(a[k], initial[k]) for k in a)        # it learned
    for k in ("steps", "updates", "answered", "accepted"):
        assert core.counters[k] == plain.counters[k], k
    assert core.counters["replied_first"] == T and plain.counters["replied_first"] == 0


def test_without_a_sender_or_turned_off_the_step_answers(folder):
    """No sender (the server found other messages waiting), or ``reply_first=False``: the
    answer comes from the step, after it, and the twin's module is never loaded."""
    for core, send in ((_core(folder), None), (_core(folder, reply_first=False), [].extend)):
        for _, raw, *_ in _messages(5):
            outs = core.ingest(raw, b"o", send)
            assert [k for k, _, _ in outs] == ["pub", "reply"] and not core.replied_first
        assert core.counters["replied_first"] == 0 and "predict" not in core.bank.runner._programs


@pytest.mark.parametrize("learning,allowed", [({"mode": "forecast"}, False),
                                              ({"mode": "forecast", "forecast_before_update": True}, True),
                                              ({"mode": "supervised"}, True)])
def test_reply_first_where_the_prediction_comes_before_the_update(folder, tmp_path, learning, allowed):
    """As serve decides it (engine.reply_first): supervised, or forecast with
    forecast_before_update; the usual forecast (made with the updated weights) never, and
    never for a folder without the twin. (The folder's learning settings are rewritten here:
    the decision reads only the manifest.)"""
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["config"]["learning"].update(learning)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert _core(copy).reply_first is allowed
    del manifest["programs"]["predict"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert _core(copy).reply_first is False


def _served_stats(folder, tmp_path, *flags) -> dict:
    """``streamtrace-runner serve`` with ``flags``, 30 SensorClient steps; its next stats."""
    from streamtrace.transport import SensorClient
    sock = f"ipc://{tmp_path}/r"
    cmd = [sys.executable, "-m", "streamtrace_runner", "serve", str(folder), "--router", sock, "--pull", "",
           "--pub", f"ipc://{tmp_path}/p", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    sub = zmq.Context.instance().socket(zmq.SUB)
    try:
        assert proc.stdout.readline().startswith("streamtrace runner:")
        sub.connect(f"ipc://{tmp_path}/p")
        sub.setsockopt(zmq.SUBSCRIBE, b"stats")
        xs = [(x, y) for _, _, x, y, _ in _messages(30)]
        with SensorClient(sock, stream="s", timeout_s=20) as c:
            for x, y in xs:
                c.step(x, y)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if sub.poll(1000):
                stats = wire.decode(sub.recv_multipart()[1])
                if stats["steps"] == len(xs):
                    return stats
        raise AssertionError("no stats after the steps")
    finally:
        sub.close(0)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


@pytest.mark.parametrize("flags,first", [((), True), (("--no-reply-first",), False)])
def test_the_server_replies_first_unless_told_not_to(folder, tmp_path, flags, first):
    """Over real sockets, one sensor: by default some replies went first (the server backs off
    while a step holds up the next message: not necessarily all); with --no-reply-first none."""
    stats = _served_stats(folder, tmp_path, *flags)
    assert stats["answered"] == 30
    assert (stats["replied_first"] > 0) is first and stats["replied_first"] <= 30


@pytest.mark.slow       # serve's engine compiles its programs (~5 s without the compile cache)
def test_replies_agree_with_serve_replying_first(folder):
    """``serve``'s engine core (EngineCore, reply_first on) and the runner, both given a
    sender: every reply sent first by both, predictions and losses within float32 rounding of
    XLA against IREE."""
    from streamtrace.engine.config import load_config
    from streamtrace.engine.core import EngineCore
    engine = EngineCore(load_config(Path(folder).parent / "gru.toml",
                                    {"engine": {"slots": SLOTS}, "publish": {"weights_every": 0}}))
    engine.warmup()
    core = _core(folder)
    for _, raw, *_ in _messages():
        e_early, r_early = [], []
        assert engine.ingest(raw, b"o") == []
        assert engine.tick(e_early.extend) == [] and core.ingest(raw, b"o", r_early.extend) == []
        got, want = _reply(r_early), _reply(e_early)
        np.testing.assert_allclose(_pred(got), _pred(want), rtol=1e-4, atol=1e-5)
        if want["loss"] is not None or got["loss"] is not None:
            np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    assert core.counters["replied_first"] == engine.metrics.counters["replied_first"] == T


def test_a_bad_busy_poll_window_is_refused_in_one_line(folder):
    r = subprocess.run([sys.executable, "-m", "streamtrace_runner", "serve", str(folder), "--busy-poll-us", "-1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--busy-poll-us must be >= 0" in r.stderr
