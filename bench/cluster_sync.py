"""What durability costs the cluster's log (streamtrace[cluster]), loopback, one run:
JetStream publish latency (``js.publish`` of a step-sized message, waited for its
acknowledgement, back to back) on

* one nats-server, JetStream's default sync (fsync every 2 minutes): today's single broker;
* one nats-server, ``sync_interval: always`` (fsync before each acknowledgement);
* three clustered nats-servers, the stream at 3 replicas, default sync;
* three clustered nats-servers, 3 replicas, ``sync_interval: always`` (``cluster up --brokers 3``'s default);

the four taken in turns (``--rounds``) of ``--samples / --rounds`` publishes each, so load on the
machine falls on all of them alike. p50 / p99 and each one's ratio to the first.

    python bench/cluster_sync.py [--samples 2000] [--rounds 4] [--write]

``--write`` replaces the "cluster-sync" section of bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing                                                   # noqa: E402
from streamtrace import wire                                    # noqa: E402
from streamtrace.cluster import jetstream as L                        # noqa: E402
from streamtrace.cluster.brokers import local_brokers, urls     # noqa: E402

SETUPS = (("1 broker, default sync", 1, None), ("1 broker, sync always", 1, "always"),
          ("3 brokers, 3 replicas, default sync", 3, None), ("3 brokers, 3 replicas, sync always", 3, "always"))


async def _publish_times(url: str, n: int, replicas: int) -> list[float]:
    nc = await L.connect(url)
    js = nc.jetstream(timeout=10)
    await L.ensure_log(js, 16, replicas=replicas)
    raw = wire.data_message("bench", 0, np.zeros(1, np.float32))
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await js.publish(L.in_subject("bench"), raw)
        out.append(time.perf_counter() - t0)
    await nc.close()
    return out


def run(samples: int, rounds: int) -> list[tuple[str, np.ndarray]]:
    tmp = tempfile.mkdtemp(prefix="streamtrace-sync-")
    clusters = []
    for i, (_, n, sync) in enumerate(SETUPS):
        nodes = local_brokers(n, port=0, store_dir=f"{tmp}/{i}", sync_interval=sync)
        for node in nodes:
            node.spawn()
        for node in nodes:
            node.wait_ready()
        clusters.append(nodes)
    try:
        times = {name: [] for name, _, _ in SETUPS}
        for r in range(rounds + 1):             # round 0 warms up (leaders elected, files created): dropped
            for (name, n, _), nodes in zip(SETUPS, clusters):
                got = asyncio.run(_publish_times(urls(nodes), max(samples // rounds, 1) if r else 50, n))
                if r:
                    times[name] += got
        return [(name, np.array(times[name]) * 1e6) for name, _, _ in SETUPS]
    finally:
        for nodes in clusters:
            for node in nodes:
                node.kill()


def table(results) -> str:
    base = np.median(results[0][1])
    lines = ["| log | publish p50 us | p99 us | p50 / single broker default |", "|---|---|---|---|"]
    for name, us in results:
        p50, p99 = np.percentile(us, 50), np.percentile(us, 99)
        lines.append(f"| {name} | {p50:.0f} | {p99:.0f} | {p50 / base:.2f}x |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    results = run(a.samples, a.rounds)
    load = f"load average {os.getloadavg()[0]:.1f} (other jobs share the cores)"
    text = (f"{table(results)}\n\n{timing.machine_line('loopback, nats-server 2.15.1, stores on ext4 (a virtio disk)', load)}; "
            f"{a.samples} acknowledged publishes per setup in {a.rounds} turns, back to back, a step-sized "
            "message (`python bench/cluster_sync.py`).")
    print(text)
    if a.write:
        from results_file import write_section
        write_section("cluster-sync", "What durability costs the log (`bench/cluster_sync.py`)", text)


if __name__ == "__main__":
    main()
