"""Cluster benchmark (streamtrace[cluster]), loopback only, every comparison in the same run:

* per-sample latency p50/p99 of ``ClusterClient.step`` against a bare NATS request/reply echo
  (its responder a thread of the client's process, and a process of its own as a worker is),
  against a JetStream echo (the log and a Python pull consumer replying at once: the cluster's
  path without the engine) and against the direct ZeroMQ path (``streamtrace serve`` with the
  same config, ``SensorClient.step``), the four taken in turns of a few hundred samples;
* steps/s with 1, 2 and 4 workers (pipelined streams; the machine's cores are shared by every
  worker, nats-server and the client, so more workers than cores cannot add throughput);
* failover: kill -9 of a worker -> the first answer from the new owner of one of its partitions;
* replay rate after failover: steps/s the new owners work through the log of the dead worker's
  partitions (from its last checkpoint, and the steps sent while nobody owned them).

    python bench/cluster.py [--samples N] [--streams S] [--steps T] [--backlog B]
    python bench/cluster.py --headline [--kill] [--streams 200 --steps 500]

A full run (not --headline) replaces the "cluster" section of bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import cluster_harness as H                                  # noqa: E402
from streamtrace.cluster import ClusterClient, NatsServer    # noqa: E402
from streamtrace.cluster import jetstream as L                     # noqa: E402

ROUNDS = 4       # latency: the paths take turns, samples / ROUNDS each per turn


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
    from timing import timed
    out = timed(lambda: c._call(c.nc.request("bench.echo", b"x" * 64, timeout=5)), n + 20)
    c.close()
    loop.call_soon_threadsafe(stop.set)
    th.join(10)
    return np.asarray(out[20:])


# A bare NATS responder in a process of its own, as a worker is.
ECHO = r"""
import asyncio, sys
from streamtrace.cluster import jetstream as L

async def main():
    nc = await L.connect(sys.argv[1])

    async def reply(m):
        await nc.publish(m.reply, m.data)
    await nc.subscribe("bench.echo2", cb=reply)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


class _EchoProcess:
    """A responder process (``script``) and a ClusterClient timing round trips to it; ``_round``
    is one round trip's coroutine."""

    def __init__(self, url: str, script: str, stream: str, what: str):
        self.proc = subprocess.Popen([sys.executable, "-c", script, url], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready", f"the {what} did not start"
        self.c, self.i = ClusterClient(url, stream=stream), 0

    def __call__(self, n: int) -> np.ndarray:
        from timing import timed

        def one():
            self.i += 1
            self.c._call(self._round(self.i))
        return np.asarray(timed(one, n))

    def close(self):
        self.c.close()
        self.proc.kill()
        self.proc.wait()


class ProcessEcho(_EchoProcess):
    """Request/reply round trips to ECHO, with the client pattern of ``echo_latency``."""

    def __init__(self, url: str):
        super().__init__(url, ECHO, "echo", "NATS echo")

    def _round(self, i):
        return self.c.nc.request("bench.echo2", b"x" * 64, timeout=5)


# The log's path without the engine: a Python process with the workers' kind of pull consumer
# (Puller) on a JetStream stream of the same storage, replying on core NATS at once.
JS_ECHO = r"""
import asyncio, sys
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig
from streamtrace.cluster import jetstream as L
from streamtrace.cluster.pull import Puller

async def main():
    nc = await L.connect(sys.argv[1])
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="BENCHJS", subjects=["bench.js.*"], storage=StorageType.FILE))
    await js.add_consumer("BENCHJS", ConsumerConfig(name="echo", ack_policy=AckPolicy.ALL, max_ack_pending=-1))
    pull = Puller(nc, "BENCHJS", "echo")
    await pull.start()
    print("ready", flush=True)
    while True:
        for m in await pull.next_batch(1.0):
            await nc.publish("bench.back", m.data, headers={"St-Log-Seq": str(m.metadata.sequence.stream)})
asyncio.run(main())
"""


class JsEcho(_EchoProcess):
    """Round trips through JS_ECHO with the client pattern of ``ClusterClient.step`` (publish and
    wait in the client's NATS thread: one hand-over between threads each way)."""

    def __init__(self, url: str):
        super().__init__(url, JS_ECHO, "jsecho", "JetStream echo")
        self.waiting = {}

        async def back(msg):
            fut = self.waiting.pop(int(msg.headers["St-Log-Seq"]), None)
            if fut is not None:
                fut.set_result(None)
        self.c._call(self.c.nc.subscribe("bench.back", cb=back))

    async def _round(self, i):
        fut = asyncio.get_running_loop().create_future()
        self.waiting[i] = fut
        await self.c.nc.publish("bench.js.x", b"x" * 64, headers={"Nats-Msg-Id": f"x:{i}"})
        await asyncio.wait_for(fut, 5)


def timed_steps(client, n: int) -> np.ndarray:
    from timing import timed
    x = np.array([0.3], np.float32)
    return np.asarray(timed(lambda: client.step(x), n))


def free_tcp() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def latency(samples: int) -> dict:
    """p50/p99 (us) of each path: one worker and one engine built from the same config."""
    from streamtrace.transport import SensorClient
    from streamtrace.engine.launch import start_engine, stop
    tmp = Path(tempfile.mkdtemp(prefix="streamtrace-bench-cluster-lat-"))
    router = free_tcp()
    cfg = H.config(tmp, slots=16)
    cfg.write_text(cfg.read_text() + f'[sockets]\nrouter = "{router}"\npull = ""\npub = ""\n')
    srv = NatsServer(store_dir=str(tmp / "store")).start()
    worker, engine, clients = None, None, []
    try:
        worker = H.start_worker(srv.url, cfg)
        engine = start_engine(cfg)
        H.wait_balanced(srv.url, 1)
        cl, zmq = ClusterClient(srv.url, stream="lat", timeout_s=30), SensorClient(router, stream="lat", timeout_s=30)
        js, echo = JsEcho(srv.url), ProcessEcho(srv.url)
        clients += [cl, zmq, js, echo]
        timed_steps(cl, 30), timed_steps(zmq, 30), js(30), echo(30)   # warm: compiled, connected, subscribed
        got = {"cluster": [], "echo": [], "echo_process": [], "js": [], "zmq": []}
        for _ in range(ROUNDS):
            k = max(samples // ROUNDS, 1)
            got["echo"].append(echo_latency(srv.url, k))
            got["echo_process"].append(echo(k))
            got["js"].append(js(k))
            got["cluster"].append(timed_steps(cl, k))
            got["zmq"].append(timed_steps(zmq, k))
    finally:
        for c in clients:
            c.close()
        if engine is not None:
            stop(engine)
        H.terminate([worker] if worker else [])
        srv.kill()
    return {k: (np.percentile(np.concatenate(v), 50) * 1e6, np.percentile(np.concatenate(v), 99) * 1e6)
            for k, v in got.items()}


class Feed:
    """Pipelined steps of ``streams`` streams into one cluster, each stream's numbering kept
    across calls; every answer's arrival (with its headers) recorded in ``client.trace``."""

    def __init__(self, url: str, streams: int, total_steps: int):
        self.c = ClusterClient(url, timeout_s=120)
        self.c.trace = []
        self.data = {f"b{k}": v for k, v in H.signals(streams, total_steps).items()}
        self.t = 0

    def run(self, steps: int) -> float:
        """Send ``steps`` steps of every stream without waiting, collect every answer: steps/s."""
        t0, t1 = self.t, self.t + steps
        start = time.perf_counter()
        H.send_steps(self.c, self.data, t0, t1)
        H.collect(self.c, {(n, s) for n in self.data for s in range(t0, t1)}, 300)
        self.t = t1
        return len(self.data) * steps / (time.perf_counter() - start)

    def owners(self) -> dict:
        """partition -> the worker that answered for it last."""
        return {int(h["St-Partition"]): h["St-Worker"] for _, _, h in self.c.trace}

    def close(self):
        self.c.close()


def failover(feed: Feed, workers: list, backlog: int) -> tuple[float, float, int]:
    """kill -9 the worker owning the most partitions with traffic, then send ``backlog`` steps of
    every stream at once. Returns (seconds from the kill to the first answer of one of its
    partitions from another worker, steps/s the new owners answered that partitions' log at
    (replay from the last checkpoint, then the steps sent meanwhile), how many)."""
    owners = feed.owners()
    by_worker = {}
    for k, w in owners.items():
        by_worker.setdefault(w, set()).add(k)
    victim_id, lost = max(by_worker.items(), key=lambda kv: len(kv[1]))
    proc = next(p for p, wid in workers if wid == victim_id)
    proc.kill()
    t_kill = time.monotonic()
    feed.run(backlog)
    after = [t for t, _, h in feed.c.trace if t > t_kill and int(h["St-Partition"]) in lost
             and h["St-Worker"] != victim_id]
    first, last = min(after), max(after)
    return first - t_kill, (len(after) - 1) / max(last - first, 1e-9), len(after)


@contextlib.contextmanager
def cluster_run(srv, workers: list, logs: list):
    """Around a bench's run on ``srv`` with ``workers`` [(process, id)]: yields a list for the
    feeds it makes; on an error prints the workers' last log lines; always closes the feeds,
    stops the workers and kills the server."""
    feeds = []
    try:
        yield feeds
    except BaseException:
        sys.stderr.write("worker logs:\n" + "".join(logs[-60:]))
        raise
    finally:
        for feed in feeds:
            feed.close()
        H.terminate([p for p, _ in workers])
        srv.kill()


def scale(streams: int, steps: int, backlog: int) -> dict:
    """steps/s with 1, 2 and 4 workers, then a failover with a backlog."""
    tmp = Path(tempfile.mkdtemp(prefix="streamtrace-bench-cluster-"))
    cfg = H.config(tmp, slots=2 * streams)      # room for every stream on one worker after a failover
    srv = NatsServer(store_dir=str(tmp / "store")).start()
    workers, logs, out = [], [], {}

    def add(n):
        for p in [H.start_worker(srv.url, cfg, "--checkpoint-every", "200", wait=False) for _ in range(n)]:
            workers.append((p, H.wait_joined(p, sink=logs)))
        H.wait_balanced(srv.url, len(workers))
    with cluster_run(srv, workers, logs) as feeds:
        add(1)
        feed = Feed(srv.url, streams, 3 * steps + backlog + 10)
        feeds.append(feed)
        feed.run(10)                                       # warm: the streams' first steps, subscriptions
        for n in (1, 2, 4):
            if len(workers) < n:
                add(n - len(workers))
            out[f"steps_s_{n}"] = feed.run(steps)
        out["failover_s"], out["replay_steps_s"], out["replayed"] = failover(feed, workers, backlog)
    return out


def table(lat: dict, sc: dict, args) -> str:
    cores = os.cpu_count()
    p = lambda k: f"{lat[k][0]:.0f} / {lat[k][1]:.0f}"   # noqa: E731
    rows = [
        "| measure | value |", "|---|---|",
        f"| step round trip through the cluster (ClusterClient.step), p50 / p99 us | {p('cluster')} |",
        f"| bare NATS request/reply echo, responder a thread of the client's process, p50 / p99 us | {p('echo')} |",
        f"| bare NATS request/reply echo, responder a process of its own (as a worker), p50 / p99 us | "
        f"{p('echo_process')} |",
        f"| JetStream echo (the log + a Python pull consumer, no engine), p50 / p99 us | {p('js')} |",
        f"| direct ZeroMQ engine (`serve`, same config, SensorClient.step), p50 / p99 us | {p('zmq')} |",
        f"| cluster / bare echo, p50 (target <= 2): responder a thread / a process | "
        f"{lat['cluster'][0] / lat['echo'][0]:.2f}x / {lat['cluster'][0] / lat['echo_process'][0]:.2f}x |",
        f"| cluster / direct ZeroMQ engine, p50 | {lat['cluster'][0] / lat['zmq'][0]:.2f}x |",
        f"| steps/s, {args.streams} streams pipelined: 1 / 2 / 4 workers | "
        f"{sc['steps_s_1']:.0f} / {sc['steps_s_2']:.0f} / {sc['steps_s_4']:.0f} |",
        f"| failover: kill -9 -> first answer from the new owner (lease ttl {H.TTL} s; target <= 5 s) | "
        f"{sc['failover_s']:.2f} s |",
        f"| replay after failover: the dead worker's partitions' log, steps/s ({sc['replayed']} steps) | "
        f"{sc['replay_steps_s']:.0f} |"]
    note = (f"Loopback, {cores} CPU cores shared by nats-server, every worker, the engine and the client (and "
            "other jobs on this machine): a worker steps on one core (one Python event loop), so a second worker "
            "can use the second core, but 4 workers on 2 cores share them with nats-server and the client: the "
            "4-worker row shows what sharding costs there, not how it scales. GRU-8 D-RTRL, one model per "
            "stream; latency: 1 worker, "
            f"engine.slots 16, {args.samples} samples per path in {ROUNDS} turns; throughput and failover: "
            f"engine.slots {2 * args.streams}, checkpoints every 200 messages or 1 s per partition.")
    return "\n".join(rows) + "\n\n" + note


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
    ap.add_argument("--samples", type=int, default=800, help="latency samples per path")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100, help="steps per stream for each worker count")
    ap.add_argument("--backlog", type=int, default=150, help="steps per stream sent right after the kill")
    ap.add_argument("--out", default="", help="write the table here too")
    ap.add_argument("--headline", action="store_true", help="3 workers, --streams x --steps, compared with one engine")
    ap.add_argument("--kill", action="store_true", help="with --headline: kill -9 one worker halfway")
    args = ap.parse_args()
    if args.headline:
        return headline(args.streams, args.steps, args.kill)
    lat = latency(args.samples)
    print("latency p50/p99 us: " + ", ".join(f"{k} {a:.0f}/{b:.0f}" for k, (a, b) in lat.items()), flush=True)
    sc = scale(args.streams, args.steps, args.backlog)
    md = table(lat, sc, args)
    print(md)
    if args.out:
        Path(args.out).write_text(md + "\n")
    from results_file import write_section
    write_section("cluster", "Scale-out on NATS JetStream (`bench/cluster.py`)", md)


if __name__ == "__main__":
    main()
