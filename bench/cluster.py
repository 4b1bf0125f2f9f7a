"""Cluster benchmark (streamtrace[cluster]): per-sample latency through NATS against a bare
NATS request/reply echo in the same run, steps/s with 1 and 2 workers, failover time (kill -9 ->
first answer from the new owner). Loopback only.  python bench/cluster.py [--steps N]"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import cluster_harness as H                                  # noqa: E402
from streamtrace.cluster import ClusterClient, NatsServer    # noqa: E402
from streamtrace.cluster import log as L                     # noqa: E402


def echo_latency(url: str, n: int) -> np.ndarray:
    """A bare NATS request/reply echo (Python on both ends), through the same client thread hop."""
    async def serve(ready, stop):
        nc = await L.connect(url)

        async def reply(m):
            await nc.publish(m.reply, m.data)
        await nc.subscribe("bench.echo", cb=reply)
        await nc.flush()
        ready.set()
        await stop.wait()
        await nc.close()
    loop = asyncio.new_event_loop()
    ready, stop = threading.Event(), asyncio.Event()
    th = threading.Thread(target=lambda: loop.run_until_complete(serve(ready, stop)), daemon=True)
    th.start()
    ready.wait(30)
    c = ClusterClient(url)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        c._call(c.nc.request("bench.echo", b"x" * 64, timeout=5))
        out.append(time.perf_counter() - t)
    c.close()
    loop.call_soon_threadsafe(stop.set)
    th.join(10)
    return np.asarray(out)


def engine_step(cfg_path, n: int) -> np.ndarray:
    """The worker's own share: one message through Stepper.step in this process (no NATS)."""
    from streamtrace import wire
    from streamtrace.cluster.stepper import Stepper
    from streamtrace.engine.config import load_config
    st = Stepper(load_config(cfg_path))
    st.warmup()
    x, out = np.array([0.3], np.float32), []
    for i in range(n + 20):
        raw = wire.data_message("e", i, x)
        t = time.perf_counter()
        st.step(raw, "e")
        out.append(time.perf_counter() - t)
    return np.asarray(out[20:])


def step_latency(url: str, n: int) -> np.ndarray:
    c = ClusterClient(url, stream="lat")
    x = np.array([0.3], np.float32)
    for _ in range(20):
        c.step(x)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        c.step(x)
        out.append(time.perf_counter() - t)
    c.close()
    return np.asarray(out)


def throughput(url: str, streams: int, steps: int, tag: str) -> float:
    c = ClusterClient(url, timeout_s=60)
    data = {f"{tag}{k}": v for k, v in H.signals(streams, steps).items()}
    t = time.perf_counter()
    H.send_steps(c, data, 0, steps)
    H.collect(c, {(k, s) for k in data for s in range(steps)}, 120)
    dt = time.perf_counter() - t
    c.close()
    return streams * steps / dt


def failover(url: str, workers, streams: int = 8) -> float:
    """kill -9 one worker while streams flow; seconds from the kill to the first answer of a
    partition it owned published by a new owner."""
    c = ClusterClient(url, timeout_s=60)
    c.trace = []
    data = H.signals(streams, 40)
    data = {f"f{k}": v for k, v in data.items()}
    H.send_steps(c, data, 0, 10)
    H.collect(c, {(n, t) for n in data for t in range(10)})
    owned = {}
    for _, _, h in c.trace:
        owned[int(h["St-Partition"])] = h["St-Worker"]
    victim_id = next(iter(owned.values()))
    victim = next(w for w, wid in workers if wid == victim_id)
    lost = {k for k, w in owned.items() if w == victim_id}
    victim.kill()
    t_kill = time.monotonic()
    H.send_steps(c, data, 10, 40)
    H.collect(c, {(n, t) for n in data for t in range(10, 40)}, 120)
    firsts = [t for t, _, h in c.trace if t > t_kill and int(h["St-Partition"]) in lost and h["St-Worker"] != victim_id]
    c.close()
    return min(firsts) - t_kill


def headline(streams: int, steps: int, kill: bool):
    """The issue's headline: 3 workers, streams x steps through NATS (optionally a kill -9 of one
    worker halfway): every step answered once after de-duplication, every prediction and final
    state bit-identical to one engine fed the same streams one message per call."""
    tmp = Path(tempfile.mkdtemp(prefix="streamtrace-bench-headline-"))
    cfg = H.config(tmp, slots=streams + 8)
    data = H.signals(streams, steps)
    t = time.perf_counter()
    ref_preds, ref_states = H.reference(cfg, data)
    print(f"reference: one engine, {streams * steps} steps in {time.perf_counter() - t:.0f} s", flush=True)
    srv = NatsServer(store_dir=str(tmp / "store")).start()
    procs = [H.start_worker(srv.url, cfg, wait=False) for _ in range(3)]
    try:
        for p in procs:
            H.wait_joined(p)
        time.sleep(3 * H.TTL)
        c = ClusterClient(srv.url, timeout_s=60)
        t = time.perf_counter()
        got = {}
        for t0 in range(0, steps, 50):
            H.send_steps(c, data, t0, min(t0 + 50, steps))
            if kill and t0 == steps // 2 // 50 * 50:
                procs[0].kill()
            got.update(H.collect(c, {(n, s) for n in data for s in range(t0, min(t0 + 50, steps))}, 600))
        dt = time.perf_counter() - t
        assert H.terminate(procs[1:] if kill else procs) == [0] * (2 if kill else 3)
        states = H.final_states(srv.url, cfg)
        H.assert_same(got, ref_preds, states, ref_states)
        print(f"headline: 3 workers{' (one killed -9 halfway)' if kill else ''}, {streams} streams x {steps} steps: "
              f"{len(got)} answered once ({c.duplicates} duplicates dropped), {len(got) / dt:.0f} steps/s, every "
              "prediction and final state bit-identical to one engine", flush=True)
        c.close()
    finally:
        H.terminate(procs)
        srv.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--headline", action="store_true", help="3 workers, --streams x --steps, compared with one engine")
    ap.add_argument("--kill", action="store_true", help="with --headline: kill -9 one worker halfway")
    args = ap.parse_args()
    if args.headline:
        return headline(args.streams, args.steps, args.kill)
    tmp = Path(tempfile.mkdtemp(prefix="streamtrace-bench-cluster-"))
    cfg = H.config(tmp, slots=64)    # every stream of the run holds a slot while its partition is owned
    srv = NatsServer(store_dir=str(tmp / "store")).start()
    procs, logs = [], []
    try:
        echo = echo_latency(srv.url, args.samples)
        eng = engine_step(cfg, args.samples)
        w = H.start_worker(srv.url, cfg, "-v", wait=False)
        procs.append((w, H.wait_joined(w, sink=logs)))
        time.sleep(2)
        r1 = throughput(srv.url, args.streams, args.steps, "one")
        lat = step_latency(srv.url, args.samples)
        print(f"latency p50/p99 us: cluster step {np.percentile(lat, 50) * 1e6:.0f}/{np.percentile(lat, 99) * 1e6:.0f}, "
              f"bare NATS echo {np.percentile(echo, 50) * 1e6:.0f}/{np.percentile(echo, 99) * 1e6:.0f}, "
              f"ratio p50 {np.percentile(lat, 50) / np.percentile(echo, 50):.2f}x; the engine step alone "
              f"(in process) {np.percentile(eng, 50) * 1e6:.0f} us", flush=True)
        w = H.start_worker(srv.url, cfg, "-v", wait=False)
        procs.append((w, H.wait_joined(w, sink=logs)))
        time.sleep(3 * H.TTL)
        r2 = throughput(srv.url, args.streams, args.steps, "two")
        print(f"steps/s ({args.streams} streams, pipelined): 1 worker {r1:.0f}, 2 workers {r2:.0f} "
              f"(2 cores shared with nats-server and the client: {os.cpu_count()} CPUs here)", flush=True)
        print(f"failover (kill -9 -> first answer from the new owner, lease ttl {H.TTL} s): "
              f"{failover(srv.url, procs):.2f} s", flush=True)
    except BaseException:
        sys.stderr.write("worker logs:\n" + "".join(logs[-60:]))
        raise
    finally:
        H.terminate([p for p, _ in procs])
        srv.kill()


if __name__ == "__main__":
    main()
