"""Restarts against a real engine (``streamtrace serve`` in a child process): the engine
restarts, the sensor process restarts (a fresh SensorClient at seq 0), or both. The sensor
loop never sees an exception and no sample is lost, repeated or reordered: every sample gets
exactly one prediction, in order (each reply echoes the ``ts`` its sample was sent with, and
the client's clock is replaced by a counter so each sample's ts names it), and the predictions
are those of one engine fed the stream once, in order, without any restart. Also: two streams
interleaved on one client, and a pipelined run of steps behind a sample the engine refuses
unread (its number unused: the later steps are resent under the engine's numbers)."""
from __future__ import annotations

from paths import ROOT
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from streamtrace.transport import EngineError, SensorClient
from streamtrace.transport import numbering
from streamtrace.engine.launch import start_engine, stop, write_config

import cluster_harness as H
from configs import ipc_sockets  # noqa: E402

K = 25          # steps per phase


class Clock:
    """Stands in for ``time`` in streamtrace/transport/numbering.py: each sample's ts is the next integer."""

    def __init__(self):
        self.t = 0.0

    def time(self) -> float:
        self.t += 1.0
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(numbering, "time", c)
    return c


@pytest.fixture
def work():
    folder = Path(tempfile.mkdtemp(prefix="st-rs-"))       # short: ipc paths are limited to ~100 chars
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _config(work: Path) -> Path:
    """A small engine that writes a checkpoint when stopped (SIGTERM) and resumes from it."""
    return write_config(work / "engine.toml", {
        "model": {"stack": "gru", "n_in": 1, "n_hidden": 8, "n_out": 1},
        "learning": {"algorithm": "d-rtrl", "mode": "forecast", "lr": 0.01},
        "engine": {"slots": 4, "micro_batch": 1},
        "sockets": ipc_sockets(work),
        "publish": {"weights_every": 0, "stats_every_s": 3600.0},
        "checkpoint": {"dir": str(work / "ckpt"), "every": 1_000_000}})


def _router(work: Path) -> str:
    return ipc_sockets(work)["router"]


class Sensor:
    """A sensor loop as the README writes it (``client.step(x)`` per sample), recording every
    reply and the ts each sample was sent with."""

    def __init__(self, xs: np.ndarray, clock: Clock):
        self.xs, self.clock = xs, clock
        self.replies, self.sent_ts = [], []

    def run(self, client, t0: int, t1: int, stream: str):
        for t in range(t0, t1):
            self.sent_ts.append(self.clock.t + 1.0)           # the ts this sample goes out with
            self.replies.append(client.step(self.xs[t], stream=stream))


def _check(sensor: Sensor, ref: dict, stream: str, n: int):
    """Every sample answered once, in order, with the prediction one engine gives for it."""
    assert len(sensor.replies) == n
    assert [r["type"] for r in sensor.replies] == ["prediction"] * n
    assert [r["seq"] for r in sensor.replies] == list(range(n))              # the engine's numbering
    assert [r["ts"] for r in sensor.replies] == sensor.sent_ts               # each sample's own answer
    got = np.stack([r.pred for r in sensor.replies])
    want = np.stack([ref[(stream, t)] for t in range(n)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("restart", ["engine", "sensor", "both"])
def test_sensor_client_survives_restarts_without_losing_a_sample(restart, work, clock, caplog):
    cfg = _config(work)
    xs = H.signals(1, 2 * K)["s0"]
    ref, _ = H.reference(cfg, {"s0": xs})
    sensor = Sensor(xs, clock)
    caplog.set_level(logging.WARNING, logger="streamtrace.client")
    proc = start_engine(cfg)
    try:
        first = SensorClient(_router(work), stream="s0", timeout_s=60)
        sensor.run(first, 0, K, "s0")
        if restart in ("engine", "both"):
            stop(proc)                       # SIGTERM: the engine checkpoints and exits
            assert proc.returncode == 0
            proc = start_engine(cfg)         # resumes from that checkpoint
        if restart in ("sensor", "both"):
            first.close()
            second = SensorClient(_router(work), stream="s0", timeout_s=60)   # a new process: seq 0
        else:
            second = first
        sensor.run(second, K, 2 * K, "s0")
        # the engine stepped each sample once: its step counter (carried over by the checkpoint)
        assert [r["step"] for r in sensor.replies] == list(range(1, 2 * K + 1))
        resynced = [r for r in caplog.records if "resynced" in r.getMessage()]
        if restart == "engine":              # a stopped engine resumes where the stream was: no resync
            assert (second.resyncs, len(resynced)) == (0, 0)
        else:                                # seq 0 refused as a repeat, expected K: one resync, logged
            assert (second.resyncs, len(resynced)) == (1, 1)
            assert f"expects seq {K}" in resynced[0].getMessage()
        second.close()
    finally:
        stop(proc)
    _check(sensor, ref, "s0", 2 * K)


def test_sensor_restart_while_pipelining(work, clock):
    """A restarted sensor that pipelines (send, send, ..., recv, ...): its first sample is
    answered (refused, resynced, resent) before the next of the stream goes out, so the rest
    are numbered right and nothing is refused twice."""
    cfg = _config(work)
    xs = H.signals(1, 2 * K)["s0"]
    ref, _ = H.reference(cfg, {"s0": xs})
    proc = start_engine(cfg)
    try:
        with SensorClient(_router(work), stream="s0", timeout_s=60) as c:
            for t in range(K):
                c.step(xs[t])
        with SensorClient(_router(work), stream="s0", timeout_s=60) as c:
            sent = [c.send(xs[t]) for t in range(K, 2 * K)]
            replies = [c.recv() for _ in range(K)]
            assert c.resyncs == 1 and c.numbering.counts["stale"] == 0
    finally:
        stop(proc)
    assert sent == [0] + list(range(K + 1, 2 * K))      # the first went out as 0; the rest after the resync
    assert [r["seq"] for r in replies] == list(range(K, 2 * K))
    assert [r["ts"] for r in replies] == [float(K + 1 + t) for t in range(K)]   # ts 1..K were the first client's
    np.testing.assert_allclose(np.stack([r.pred for r in replies]),
                               np.stack([ref[("s0", t)] for t in range(K, 2 * K)]), rtol=1e-5, atol=1e-6)


def test_two_streams_interleaved_on_one_client_are_numbered_per_stream(work, clock):
    cfg = _config(work)
    data = H.signals(2, K)
    ref, _ = H.reference(cfg, data)
    proc = start_engine(cfg)
    try:
        with SensorClient(_router(work), stream="s0", timeout_s=60) as c:
            seqs = []
            for t in range(K):                             # pipelined, alternating streams
                seqs += [c.send(data["s0"][t], stream="s0"), c.send(data["s1"][t], stream="s1")]
            replies = [c.recv() for _ in range(2 * K)]
            more = [c.step(data["s1"][0], stream="s1"), c.step(data["s0"][0])]   # step names a stream too
            assert c.resyncs == 0
    finally:
        stop(proc)
    assert seqs == [t for t in range(K) for _ in range(2)]
    for s in ("s0", "s1"):              # each stream's replies in its own order (the two may interleave any way)
        assert [r["seq"] for r in replies if r["stream"] == s] == list(range(K))
    for r in replies:                   # each stream's samples stepped once each, in order
        np.testing.assert_allclose(r.pred, ref[(r["stream"], r["seq"])], rtol=1e-5, atol=1e-6)
    assert [(r["stream"], r["seq"]) for r in more] == [("s1", K), ("s0", K)]


def test_steps_pipelined_behind_a_refused_sample_are_resent_in_order(work, clock):
    """A sample refused unread (wrong shape) uses no number, so the steps already sent behind
    it skip ahead (``gap``); the client resends them under the engine's numbers, in order, drops
    the refusals still on their way, and hands the caller the one real error."""
    cfg = _config(work)
    xs = H.signals(1, 5)["s0"]
    ref, _ = H.reference(cfg, {"s0": xs})
    proc = start_engine(cfg)
    try:
        with SensorClient(_router(work), stream="s0", timeout_s=60) as c:
            c.send(xs[0])
            c.send(np.zeros(3, np.float32))              # refused unread: bad_shape
            for t in range(1, 5):
                c.send(xs[t])                            # sent as 2..5: gaps
            first = c.recv()
            with pytest.raises(EngineError) as refused:
                c.recv()
            rest = [c.recv() for _ in range(4)]
            assert (c.resyncs, c.numbering.counts["stale"]) == (1, 3)
            assert c.step(xs[0])["seq"] == 5             # the numbering goes on from the engine's
    finally:
        stop(proc)
    assert (refused.value.code, refused.value.seq) == ("bad_shape", 1)
    replies = [first] + rest
    assert [r["seq"] for r in replies] == [0, 1, 2, 3, 4]
    assert [r["ts"] for r in replies] == [1.0, 3.0, 4.0, 5.0, 6.0]      # ts 2.0 was the refused sample
    np.testing.assert_allclose(np.stack([r.pred for r in replies]), np.stack([ref[("s0", t)] for t in range(5)]),
                               rtol=1e-5, atol=1e-6)


def test_the_clients_doc_example_runs_as_written(work, capsys):
    """docs/clients.md's example, against an engine of one input (only the endpoint changed)."""
    text = (ROOT / "docs" / "clients.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert '"tcp://127.0.0.1:5555"' in code
    proc = start_engine(_config(work))
    try:
        capsys.readouterr()
        exec(compile(code.replace('"tcp://127.0.0.1:5555"', repr(_router(work))), "clients.md", "exec"), {})
    finally:
        stop(proc)
    assert capsys.readouterr().out.split() == ["bad_shape", "1", "1"]


def test_the_client_classes_docstring_examples_run_as_written(work, capsys):
    """SensorClient's and PushClient's examples, against an engine of one input."""
    from doc_examples import docstring_example
    from streamtrace.transport import PushClient
    cfg = _config(work)
    text = cfg.read_text().replace('pull = ""', f'pull = "ipc://{work}/p"')
    cfg.write_text(text)
    proc = start_engine(cfg)
    try:
        capsys.readouterr()
        exec(docstring_example(SensorClient, "tcp://127.0.0.1:5555", _router(work)), {})
        assert capsys.readouterr().out.split() == ["bad_shape"]
        scope = {}
        exec(docstring_example(PushClient, "tcp://127.0.0.1:5556", f"ipc://{work}/p"), scope)
        assert scope["push"].seq == 3                                 # three handed over, numbered 0, 1, 2
    finally:
        stop(proc)
