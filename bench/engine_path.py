"""Where an engine's time goes per message: ``python bench/engine_path.py [--hidden 64]``.

A real ``Engine`` (ZeroMQ ipc sockets, the serve loop) runs in this process while one sensor
in a child process sends request/reply round trips, as ``streamtrace bench`` does. The
engine's functions are wrapped from the outside with ``time.perf_counter_ns`` spans (nothing
is added to the engine's code: serving pays nothing for this), and the table gives the median
of each span per message. "loop" is what is left of the engine's wall time per message: the
poll, the loop's own bookkeeping, and the wrappers (~0.2 us each). The round trip seen by
the sensor is printed too.

``--python-only``: the engine's own Python per message with nothing else in the loop (no
sockets; the compiled step replaced by its last output, so caches stay warm): ``ingest`` +
``tick``, the number the <= 20 us target is about.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

SPANS = ("recv", "decode", "checks", "route", "batch", "dispatch", "wait", "split", "reply", "metrics", "send")


def sensor(endpoint, n, warmup, q):
    from streamtrace.transport.timing import roundtrips
    q.put(roundtrips(endpoint, n, None, warmup=warmup))


def timed(spans, name, fn):
    ns = time.perf_counter_ns

    def wrapper(*a, **k):
        t = ns()
        try:
            return fn(*a, **k)
        finally:
            spans[name] += ns() - t
    return wrapper


def timed_call(spans, name, call):
    """``timed`` for a compiled step: the wrapper keeps the step's packed input views, which
    the engine fills in place (learner/inputs.py)."""
    wrapper = timed(spans, name, call)
    wrapper.inputs = call.inputs
    return wrapper


def python_only(cfg, n=20000, repeats=5):
    """Median over ``repeats`` blocks of the per-message median of ingest + tick, in us."""
    from streamtrace import wire
    from streamtrace.engine.core import EngineCore
    core = EngineCore(cfg)
    core.warmup()
    L = core.learner
    if core.banked:      # one step's output vector, to stand for every step below
        L.states[0], vec = L.programs.run(L.states[0], *L.views())
    else:
        L.buffers, vec = L.programs.run(L.buffers, *core.planner.inputs(1)[0])
    L.programs.run = lambda buffers, *a, **k: (buffers, vec)
    x = np.zeros(cfg.model.n_in, np.float32)
    msgs = [wire.data_message("bench", i, x, ts=time.time()) for i in range(n)]
    block, meds = n // repeats, []
    for r in range(repeats):
        ts = np.empty(block)
        for i in range(block):
            t = time.perf_counter_ns()
            core.ingest(msgs[r * block + i], b"id")
            core.tick()
            ts[i] = time.perf_counter_ns() - t
        meds.append(np.median(ts[200:]))
    return float(np.median(meds)) / 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--algorithm", default="d-rtrl")
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--cpu", type=int, default=-1, help="pin the engine to this CPU (-1: no)")
    ap.add_argument("--python-only", action="store_true", help="ingest + tick alone, the step replaced")
    args = ap.parse_args(argv)

    from streamtrace import wire
    from streamtrace.engine import load_config, server
    from streamtrace.engine.server import Engine
    folder = Path(tempfile.mkdtemp(prefix="st-path-", dir="/tmp"))
    ep = f"ipc://{folder}/r"
    cfg = load_config(None, {
        "model": {"stack": "gru", "n_in": 1, "n_hidden": args.hidden, "n_out": 1},
        "learning": {"algorithm": args.algorithm, "mode": "forecast"},
        "engine": {"slots": 1, "cpu": args.cpu}, "sockets": {"router": ep, "pull": "", "pub": ""},
        "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False}})
    if args.python_only:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"engine Python per message (ingest + tick; no sockets, no XLA): {python_only(cfg):.1f} us")
        return
    engine = Engine(cfg)      # as serve: the other programs compile during the sensor's warm-up
    core, L = engine.core, engine.core.learner

    spans = defaultdict(int)
    per_msg = defaultdict(list)
    ns = time.perf_counter_ns
    turn = {}
    total = 500 + args.steps

    recv = server.recv_message

    def recv_first(*a, **k):      # a message's work starts when its frames are read
        turn.setdefault("t0", ns())
        return recv(*a, **k)
    # wrap from the outside: module functions the engine looks up at call time, and methods
    server.recv_message = timed(spans, "recv", recv_first)
    wire.decode = timed(spans, "decode", wire.decode)
    wire.decode_data = timed(spans, "checks", wire.decode_data)
    core._accept = timed(spans, "route", core._accept)
    core.planner.inputs = timed(spans, "batch", core.planner.inputs)
    compiled = L.programs.step
    L.programs.step = lambda k=None: timed_call(spans, "dispatch", compiled(k))
    L.programs.run = timed(spans, "wait", L.programs.run)      # minus dispatch, below
    L.programs.decode = timed(spans, "split", L.programs.decode)
    core.answers.encode = timed(spans, "reply", core.answers.encode)
    m = core.metrics
    for name in ("count", "loss", "latency"):
        setattr(m, name, timed(spans, "metrics", getattr(m, name)))
    send = timed(spans, "send", engine._send)

    def send_and_record(outs):
        send(outs)
        if any(kind == "reply" for kind, _, _ in outs) and "t0" in turn:
            spans["wait"] -= spans["dispatch"]
            for s in SPANS:
                per_msg[s].append(spans[s])
            per_msg["engine wall"].append(ns() - turn.pop("t0"))
            spans.clear()
            if len(per_msg["engine wall"]) >= total:
                engine.stop()
    engine._send = send_and_record

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    client = ctx.Process(target=sensor, args=(ep, args.steps, 500, q))
    client.start()
    try:
        engine.run(install_signals=False, max_seconds=120 + args.steps * 0.01)
        rt = q.get(timeout=60)
    finally:
        client.join(5)
        shutil.rmtree(folder, ignore_errors=True)
    skip = 500      # the sensor's warm-up
    rows = {s: np.median(v[skip:]) / 1e3 for s, v in per_msg.items()}
    # the reply span runs inside send's caller (tick), send wraps the socket calls only;
    # "send" also holds the first empty tick of a turn: all spans are disjoint by construction
    named = sum(rows[s] for s in SPANS)
    wall = rows["engine wall"]
    print(f"GRU-{args.hidden} {args.algorithm}, ipc, one sensor, {args.steps} round trips (median us per message)")
    print("| span | what | us |")
    print("|---|---|---:|")
    what = {"recv": "read the frames off the ROUTER socket", "decode": "msgpack decode + version/type check",
            "checks": "field, shape, dtype and finiteness checks", "route": "stream -> slot, sequence checks, queue",
            "batch": "input buffers for the call", "dispatch": "the compiled call (engine.sync_dispatch, the default: XLA runs in it)",
            "wait": "the output vector to numpy (with async dispatch: waiting for XLA too)", "split": "prediction / loss / applied from "
            "the output vector", "reply": "prediction reply encoded", "metrics": "counters, loss, latency window",
            "send": "reply frames to the ROUTER socket"}
    for s in SPANS:
        print(f"| {s} | {what[s]} | {rows[s]:.1f} |")
    print(f"| loop | the loop's own work, ingest's and tick's bookkeeping (wall minus the spans) | "
          f"{wall - named:.1f} |")
    print(f"| **engine wall** | from reading a message to its reply sent | {wall:.1f} |")
    py = wall - rows["dispatch"] - rows["wait"]
    print(f"\nengine wall minus the step and its output ({py:.1f} us): Python and sockets per message, "
          f"in the loop (caches cold after each step); --python-only for the hot-loop Python alone")
    from timing import percentiles
    p = percentiles(rt, 1.0)
    print(f"sensor round trip: p50 {p['p50']:.0f} us, p99 {p['p99']:.0f} us")


if __name__ == "__main__":
    main()
