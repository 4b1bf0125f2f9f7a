"""Where to put the engine on a small machine: ``python bench/placement.py``.

For each placement (the engine's CPU, ``engine.cpu``; the sensor's CPU; XLA's intra-op
threads) a real ``streamtrace serve`` (GRU-64 ES-D-RTRL) answers either one sensor
(request/reply round trips: p50 / p99 latency) or 64 streams pipelined over one connection
(every stream sends one step, then all 64 answers are read: stream-steps per second).
One run per placement, all in the same invocation, so the rows compare.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from streamtrace.engine.launch import start_engine, stop, write_config
from timing import percentiles, pin, timed, unpin

ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def one_sensor(ep, n):
    from streamtrace.transport import SensorClient
    x = np.zeros(1, np.float32)
    with SensorClient(ep, stream="s", timeout_s=60) as c:
        p = percentiles(timed(lambda: c.step(x), n, warmup=300))
    return {"p50_us": p["p50"], "p99_us": p["p99"]}


def many_streams(ep, streams, rounds):
    from streamtrace.transport import SensorClient
    x = np.zeros(1, np.float32)
    with SensorClient(ep, stream="s", timeout_s=60) as c:
        seqs = [0] * streams

        def one_round():
            for s in range(streams):
                c.send(x, stream=f"s{s}", seq=seqs[s])
                seqs[s] += 1
            for _ in range(streams):
                c.recv()
        for _ in range(30):
            one_round()
        t = time.perf_counter()
        for _ in range(rounds):
            one_round()
        dt = time.perf_counter() - t
    return {"stream_steps_per_s": streams * rounds / dt}


def run(work, name, *, engine_cpu, sensor_cpu, xla_one_thread, streams, n):
    ep = f"ipc://{work}/{name}"
    cfg = write_config(work / f"{name}.toml", {
        "model": {"stack": "gru", "n_in": 1, "n_hidden": 64, "n_out": 1},
        "learning": {"algorithm": "es-d-rtrl", "mode": "forecast"},
        "engine": {"slots": max(streams, 1), "cpu": engine_cpu},
        "sockets": {"router": ep, "pull": "", "pub": ""},
        "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False}})
    env_before = os.environ.get("XLA_FLAGS")
    if xla_one_thread:
        os.environ["XLA_FLAGS"] = ONE_THREAD
    try:
        proc = start_engine(cfg)
    finally:
        if env_before is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = env_before
    try:
        pin(sensor_cpu)
        time.sleep(3)      # the micro-batch sizes compile after the first quiet second
        return one_sensor(ep, n) if streams == 1 else many_streams(ep, streams, max(n // streams, 20))
    finally:
        unpin()
        stop(proc)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3000, help="round trips (1 stream) / stream-steps (64)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="st-place-", dir="/tmp"))
    placements = [("unpinned", -1, -1, False), ("unpinned, XLA 1 thread", -1, -1, True),
                  ("engine CPU 1, sensor CPU 0", 1, 0, False), ("engine CPU 1, sensor CPU 0, XLA 1 thread", 1, 0, True),
                  ("both on CPU 0", 0, 0, False)]
    print("| placement | 1 sensor p50 µs | 1 sensor p99 µs | 64 streams stream-steps/s |")
    print("|---|---:|---:|---:|")
    try:
        for i, (label, ecpu, scpu, one) in enumerate(placements):
            a = run(work, f"a{i}", engine_cpu=ecpu, sensor_cpu=scpu, xla_one_thread=one, streams=1, n=args.steps)
            b = run(work, f"b{i}", engine_cpu=ecpu, sensor_cpu=scpu, xla_one_thread=one, streams=64, n=args.steps * 4)
            print(f"| {label} | {a['p50_us']:.0f} | {a['p99_us']:.0f} | {b['stream_steps_per_s']:.0f} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
