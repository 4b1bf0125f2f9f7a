"""Latency of the LSL bridge against its bus floor and the engine's own round trip, in one run.

    .venv/bin/python bench/bridge_latency_lsl.py [--steps 2000] [--rounds 5] [--json FILE]

Three round trips, one sample in flight at a time, measured in rounds that alternate between
them (so that load on a shared machine falls on all three alike):

* **bus floor**: a sample pushed on an LSL outlet, taken by a relay process's inlet and pushed
  straight back on the relay's outlet (LSL outlet -> inlet twice, no engine);
* **engine end to end**: ``SensorClient.step`` against the engine (ZeroMQ, learning step);
* **bridge**: a sample pushed on an LSL outlet, forwarded by ``streamtrace bridge lsl`` to the
  same engine, and its prediction taken off the bridge's ``<name>-pred`` outlet.

The bridge's round trip contains both other paths (two LSL hops and one engine round trip), so
the overhead the bridge itself adds is ``bridge - (engine e2e + bus floor)``; the issue's bar is
that the bridge adds at most 1.3x the engine's own end-to-end time:
``(bridge - bus floor) / engine e2e <= 1.3``. Not a test: nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from timing import cpu_name, percentiles

ENGINE = {
    "model": {"stack": "gru", "n_in": 2, "n_hidden": 64, "n_out": 2},
    "learning": {"algorithm": "d-rtrl", "mode": "forecast", "optimizer": "adam", "lr": 1e-3},
    "engine": {"slots": 4, "micro_batch": 1, "park_s": 0.0},
    "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False},
    "checkpoint": {"dir": ""},
}


def relay(name: str):
    """The bus floor's far end: every sample of ``name`` pushed back on ``name``-echo at once,
    received the way the bridge receives (a blocking chunk pull that returns on the first sample)."""
    import pylsl
    (info,) = pylsl.resolve_byprop("name", name, 1, 30)
    inlet = pylsl.StreamInlet(info, max_buflen=10, recover=True)
    inlet.open_stream(30)
    out = pylsl.StreamOutlet(pylsl.StreamInfo(name + "-echo", "Echo", info.channel_count(), info.nominal_srate(),
                                              pylsl.cf_float32, name + "-echo"), chunk_size=1)
    while True:
        x, ts = inlet.pull_chunk(timeout=1.0, max_samples=64, min_samples=1, as_numpy=True)
        for row, t in zip(x, ts):
            out.push_sample(row, t)


def lsl_round_trips(outlet, inlet, n: int, start: int) -> np.ndarray:
    """Push sample k, wait for the answer stamped with k's timestamp; seconds per round trip."""
    import pylsl
    rtt = np.empty(n)
    for i in range(n):
        k = start + i
        x = [np.sin(0.1 * k), np.cos(0.1 * k)]
        stamp = 1000.0 + k                    # any increasing clock: matched on the way back
        t0 = time.perf_counter()
        outlet.push_sample(x, stamp)
        while True:
            _, ts = inlet.pull_sample(timeout=10.0)
            if ts is None:
                raise RuntimeError(f"no answer to sample {k} within 10 s")
            if abs(ts - stamp) < 0.01:        # the bridge adds LSL's clock offset (~us on one host)
                break
        rtt[i] = time.perf_counter() - t0
    return rtt


def open_answers(name: str, outlet, timeout: float = 120.0):
    """An inlet on ``name`` once it exists; ``outlet`` is pushed meanwhile (the bridge makes its
    prediction outlet at the first answer). Leftover answers are drained."""
    import pylsl
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        outlet.push_sample([0.0, 0.0], 1.0)
        found = pylsl.resolve_byprop("name", name, 1, 0.3)
        if found:
            inlet = pylsl.StreamInlet(found[0], max_buflen=10, processing_flags=0)
            inlet.open_stream(30)
            time.sleep(0.5)
            inlet.flush()
            return inlet
    raise RuntimeError(f"no LSL stream {name!r} within {timeout} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000, help="round trips per path (after warm-up)")
    ap.add_argument("--rounds", type=int, default=5, help="alternations between the three paths")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--transport", choices=["ipc", "tcp"], default="ipc", help="engine socket")
    ap.add_argument("--json", default=None, help="write the numbers here too")
    ap.add_argument("role", nargs="?", default=None, help=argparse.SUPPRESS)
    ap.add_argument("relay_name", nargs="?", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "relay":
        relay(args.relay_name)
        return 0

    import pylsl
    from streamtrace.transport import SensorClient
    from streamtrace.engine.launch import start_engine, stop, write_config

    tag = uuid.uuid4().hex[:8]
    floor_name, dev_name = f"bench-floor-{tag}", f"bench-dev-{tag}"
    sock = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    if args.transport == "ipc":
        router = f"ipc://{sock}/router"
    else:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            router = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    cfg = write_config(sock / "engine.toml", {**ENGINE, "sockets": {"router": router, "pull": "", "pub": ""}})
    procs = []
    try:
        engine = start_engine(cfg)
        procs.append(engine)
        floor_out = pylsl.StreamOutlet(pylsl.StreamInfo(floor_name, "Bench", 2, 0.0, pylsl.cf_float32, floor_name),
                                       chunk_size=1)
        dev_out = pylsl.StreamOutlet(pylsl.StreamInfo(dev_name, "Bench", 2, 0.0, pylsl.cf_float32, dev_name),
                                     chunk_size=1)
        procs.append(subprocess.Popen([sys.executable, __file__, "relay", floor_name]))
        procs.append(subprocess.Popen([sys.executable, "-m", "streamtrace", "bridge", "lsl", "--name", dev_name,
                                       "--endpoint", router, "--wait", "60", "--rescan", "0",
                                       "--stats-json", str(sock / "bridge.json")],
                                      stderr=subprocess.DEVNULL))
        floor_in = open_answers(floor_name + "-echo", floor_out)
        bridge_in = open_answers(dev_name + "-pred", dev_out)
        client = SensorClient(router, stream=f"bench-e2e-{tag}", timeout_s=60)

        def e2e(n, start):
            from timing import timed
            k = iter(range(start, start + n))
            return np.asarray(timed(lambda: client.step([np.sin(0.1 * (j := next(k))), np.cos(0.1 * j)]), n))

        paths = {"bus floor": lambda n, k: lsl_round_trips(floor_out, floor_in, n, k),
                 "engine e2e": e2e,
                 "bridge": lambda n, k: lsl_round_trips(dev_out, bridge_in, n, k)}
        for f in paths.values():
            f(args.warmup, 0)
        per_round = max(1, args.steps // args.rounds)
        got = {p: [] for p in paths}
        for r in range(args.rounds):
            for p, f in paths.items():
                got[p].append(f(per_round, args.warmup + r * per_round))
        client.close()
    finally:
        for p in reversed(procs):
            stop(p)
        if procs and procs[0].stdout is not None:
            procs[0].stdout.close()
        bridge_stats = json.loads((sock / "bridge.json").read_text()) if (sock / "bridge.json").exists() else {}
        shutil.rmtree(sock, ignore_errors=True)

    res = {p: percentiles(np.concatenate(v)) for p, v in got.items()}
    fl, en, br = res["bus floor"], res["engine e2e"], res["bridge"]
    ratio = {q: (br[q] - fl[q]) / en[q] for q in ("p50", "p99")}
    overhead = {q: br[q] - fl[q] - en[q] for q in ("p50", "p99")}
    out = {"machine": f"{cpu_name()}, {os.cpu_count()} CPUs", "transport": args.transport, "model": "GRU-64 D-RTRL forecast",
           "paths_us": res, "bridge_minus_floor_over_e2e": ratio, "bridge_overhead_us": overhead,
           "engine_rtt_seen_by_bridge_us": bridge_stats.get("engine_rtt_us")}
    print(f"LSL bridge latency ({out['machine']}, engine over {args.transport}, {out['model']}, "
          f"{fl['n']} round trips per path)")
    print("| path | p50 µs | p99 µs |\n|---|---:|---:|")
    for p, v in res.items():
        print(f"| {p} | {v['p50']:.0f} | {v['p99']:.0f} |")
    print(f"| bridge overhead (bridge - floor - e2e) | {overhead['p50']:.0f} | {overhead['p99']:.0f} |")
    print(f"| (bridge - floor) / engine e2e | {ratio['p50']:.2f} | {ratio['p99']:.2f} |")
    seen = out["engine_rtt_seen_by_bridge_us"]
    if seen:      # its whole run, warm-up included
        print(f"engine round trip as the bridge saw it: p50 {seen['p50']:.0f} µs, p99 {seen['p99']:.0f} µs")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
