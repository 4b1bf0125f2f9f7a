"""The round trip through the cluster on replicated, synced brokers (streamtrace[cluster]),
loopback, one run: ``ClusterClient.step`` p50 / p99 through

* one nats-server, JetStream's default sync (fsync every 2 minutes), one worker: the single broker;
* three clustered nats-servers, the log, leases and checkpoints at 3 replicas, ``sync_interval:
  always`` (``cluster up --brokers 3``'s default), one worker;
* and a bare NATS request/reply echo (a responder process of its own, as a worker is) on the
  single broker: what NATS alone costs;

the three taken in turns (``--rounds``) of ``--samples / --rounds`` round trips each, so load on
the machine falls on all alike; each one's ratio to the echo.

    python bench/cluster_rtt.py [--samples 800] [--rounds 4] [--write]

``--write`` replaces the "cluster-rtt" section of bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_harness as H                                      # noqa: E402
import timing                                                    # noqa: E402
from cluster import ProcessEcho, timed_steps                     # noqa: E402
from streamtrace.cluster import ClusterClient                    # noqa: E402
from streamtrace.cluster.brokers import local_brokers, urls      # noqa: E402

PATHS = (("bare NATS echo (1 broker, a responder process)", "echo"),
         ("cluster, 1 broker, default sync", "one"),
         ("cluster, 3 brokers, 3 replicas, sync always", "three"))


def start(n: int, store: Path, sync):
    nodes = local_brokers(n, port=0, store_dir=str(store), sync_interval=sync)
    for node in nodes:
        node.spawn()
    for node in nodes:
        node.wait_ready()
    return nodes


def run(samples: int, rounds: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="streamtrace-bench-rtt-"))
    cfg = H.config(tmp, slots=16)
    one, three = start(1, tmp / "one", None), start(3, tmp / "three", "always")
    workers, closers = [], []
    try:
        for nodes, extra in ((one, ()), (three, ("--replicas", "3"))):
            workers.append(H.start_worker(urls(nodes), cfg, *extra))
            H.wait_balanced(urls(nodes), 1)
        echo = ProcessEcho(urls(one))
        c1 = ClusterClient(urls(one), stream="rtt", timeout_s=30)
        c3 = ClusterClient(urls(three), stream="rtt", timeout_s=30)
        closers += [echo, c1, c3]
        paths = {"echo": echo, "one": lambda n: timed_steps(c1, n), "three": lambda n: timed_steps(c3, n)}
        for f in paths.values():
            f(30)                                # warm: compiled, connected, subscribed
        got = {k: [] for k in paths}
        for _ in range(rounds):
            for k, f in paths.items():
                got[k].append(f(max(samples // rounds, 1)))
    finally:
        for c in closers:
            c.close()
        H.terminate(workers)
        for node in one + three:
            node.kill()
    return {k: np.concatenate(v) * 1e6 for k, v in got.items()}


def table(got: dict, samples: int) -> str:
    echo = np.percentile(got["echo"], 50)
    rows = ["| path | p50 us | p99 us | p50 / echo |", "|---|---|---|---|"]
    for title, k in PATHS:
        rows.append(f"| {title} | {np.percentile(got[k], 50):.0f} | {np.percentile(got[k], 99):.0f} | "
                    f"{np.percentile(got[k], 50) / echo:.2f}x |")
    return "\n".join(rows) + (
        f"\n\n{timing.machine_line('loopback', f'load average {os.getloadavg()[0]:.1f}')}: the cores shared by every "
        f"nats-server, both workers, the client (and other jobs on this machine); {samples} round trips per path in turns; GRU-8 D-RTRL, one worker per setup, "
        "engine.slots 16. A step's round trip: the client publishes to the log (no acknowledgement waited for), the "
        "owner pulls it, steps, publishes the answer on core NATS; with 3 replicas and sync always the log stores "
        "the step on 2 of 3 nodes, each with an fsync, before the worker's pull sees it.")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=800)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    md = table(run(args.samples, args.rounds), args.samples)
    print(md)
    if args.write:
        from results_file import write_section
        write_section("cluster-rtt", "Round trip on replicated, synced brokers (`bench/cluster_rtt.py`)", md)


if __name__ == "__main__":
    main()
