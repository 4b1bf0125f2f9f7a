"""Helpers for the end-to-end engine tests (tests/engine/test_engine_e2e.py).

* ``running_engine``: write a TOML config, start ``python -m streamtrace serve`` in a child
  process with ``streamtrace.engine.launch.start_engine`` and stop it (SIGTERM) on the way out;
  sockets are ipc:// endpoints in a short temporary folder (ipc paths are limited to ~100
  characters, pytest's tmp_path can be longer).
* ``supervised_data``: the deterministic per-stream data of the multi-stream test, generated
  identically in the client processes and in the test process.
* Run as a script (``python engine_helpers.py client ...``) it is one sensor process of the
  multi-stream test: 16 streams pipelined over one DEALER, every reply counted per
  (stream, seq) and written to an .npz file.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

N_IN, N_OUT = 3, 2


# ---- the engine in another process -----------------------------------------------------------
@contextlib.contextmanager
def running_engine(folder: Path, sections: dict, *, name: str = "engine"):
    """Yields ``(proc, endpoints, config_path)``; endpoints: router, pull, pub (ipc://)."""
    from configs import ipc_sockets
    from streamtrace.engine.launch import start_engine, stop, write_config
    sock_dir = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    ep = ipc_sockets(sock_dir, pull=True, pub=True)
    sections = {k: dict(v) for k, v in sections.items()}
    sections.setdefault("sockets", {}).update(ep)
    cfg_path = write_config(Path(folder) / f"{name}.toml", sections)
    proc = start_engine(cfg_path)
    try:
        yield proc, ep, cfg_path
    finally:
        try:
            stop(proc)
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
            shutil.rmtree(sock_dir, ignore_errors=True)


def answers(core, msgs) -> list:
    """An in-process ``EngineCore``'s decoded replies to the raw messages ``msgs``, each run to
    completion before the next."""
    from streamtrace import wire
    got = []
    for raw in msgs:
        outs = core.ingest(raw, b"o")
        while core.has_pending():
            outs += core.tick()
        got += [wire.decode(r) for kind, _, r in outs if kind == "reply"]
    return got


class _Reply(dict):
    @property
    def pred(self):
        return self["pred"]


def fake_sensor_client(answer, flags=None):
    """A stand-in for ``SensorClient`` (monkeypatched where a test needs no engine): the k-th
    ``step(xs, ys)`` of a client (k from 1) answers ``answer(xs, ys, k)`` as the reply's ``pred``,
    with the reply's fields ``flags(xs, ys, k)`` (e.g. ``{"outlier": True}``) where given."""
    class Fake:
        def __init__(self, *a, **k):
            self.k = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def step(self, xs, ys=None):
            self.k += 1
            extra = {} if flags is None else flags(xs, ys, self.k)
            return _Reply(pred=np.asarray(answer(xs, ys, self.k)), **extra)
    return Fake


def stop_gracefully(proc, timeout: float = 30.0) -> int:
    """SIGTERM and wait: the engine drains, writes its final checkpoint and exits."""
    proc.terminate()
    return proc.wait(timeout)


def loss_value(reply) -> float:
    return float("nan") if reply["loss"] is None else float(reply["loss"])


# ---- multi-stream data ---------------------------------------------------------------------------
def stream_name(proc_index: int, j: int) -> str:
    return f"p{proc_index}-s{j:02d}"


def stream_index(name: str, per_proc: int) -> int:
    p, s = name[1:].split("-s")
    return int(p) * per_proc + int(s)


def supervised_data(index: int, steps: int):
    """Inputs (steps, N_IN) and targets (steps, N_OUT), float32, different for every stream."""
    rng = np.random.default_rng(1000 + index)
    t = np.arange(steps, dtype=np.float64)[:, None]
    phase, freq = rng.uniform(0, 2 * np.pi), rng.uniform(0.1, 0.3)
    xs = np.sin(freq * t + phase + np.arange(N_IN)) + 0.1 * rng.standard_normal((steps, N_IN))
    ys = 0.8 * np.sin(freq * t - 1.0 + phase + np.arange(N_OUT))
    return xs.astype(np.float32), ys.astype(np.float32)


# ---- one sensor process of the multi-stream test ----------------------------------------------
def run_client(endpoint: str, proc_index: int, per_proc: int, steps: int, window: int, out: str):
    """Pipelined: step t of every stream is sent, and the replies are read ``window`` steps
    behind. Every reply (prediction or error) is counted per (stream, seq)."""
    from streamtrace.transport import SensorClient
    names = [stream_name(proc_index, j) for j in range(per_proc)]
    data = [supervised_data(stream_index(n, per_proc), steps) for n in names]
    counts = np.zeros((per_proc, steps), np.int64)
    preds = np.full((per_proc, steps, N_OUT), np.nan, np.float32)
    engine_step = np.zeros((per_proc, steps), np.int64)
    errors, unexpected = [], []
    col = {n: j for j, n in enumerate(names)}

    def take(reply):
        if reply["type"] == "error":
            errors.append({k: reply.get(k) for k in ("code", "message", "stream", "seq")})
            return
        j, seq = col.get(reply["stream"]), reply["seq"]
        if j is None or not 0 <= seq < steps:
            unexpected.append(f"{reply['stream']}/{seq}")
            return
        counts[j, seq] += 1
        preds[j, seq] = reply.pred
        engine_step[j, seq] = reply["step"]

    sent = received = 0
    with SensorClient(endpoint, stream=names[0], timeout_s=60) as c:
        for t in range(steps):
            for j, n in enumerate(names):
                xs, ys = data[j]
                c.send(xs[t], ys[t], stream=n, seq=t)
                sent += 1
            while sent - received > window * per_proc:
                take(c.recv(raise_errors=False))
                received += 1
        while received < sent:
            take(c.recv(raise_errors=False))
            received += 1
        # anything beyond one answer per message would show up here
        c.timeout_ms = 300
        while True:
            try:
                take(c.recv(raise_errors=False))
            except TimeoutError:
                break
    np.savez(out, counts=counts, preds=preds, steps=engine_step, names=np.array(names),
             errors=np.array(json.dumps(errors)), unexpected=np.array(json.dumps(unexpected)))


def fake_engine():
    """A ROUTER standing in for the engine, for what a bridge forwards: ``(socket, endpoint,
    received)``; ``received(n)`` reads up to ``n`` data messages off the wire, their ``x`` as rows."""
    import zmq

    from streamtrace import wire
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")

    def received(n, timeout=20.0):
        rows, end = [], time.monotonic() + timeout
        while len(rows) < n and time.monotonic() < end:
            if sock.poll(100):
                msg = wire.decode(sock.recv_multipart()[-1])
                rows.append(wire.unpack_array(msg["x"]).astype(np.float64))
        return np.array(rows)
    return sock, f"tcp://127.0.0.1:{port}", received


if __name__ == "__main__":
    if len(sys.argv) != 8 or sys.argv[1] != "client":
        sys.exit("usage: engine_helpers.py client ENDPOINT PROC_INDEX PER_PROC STEPS WINDOW OUT.npz")
    t0 = time.perf_counter()
    run_client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
    print(f"client {sys.argv[3]} done in {time.perf_counter() - t0:.1f}s", flush=True)

