"""Worker failover at the defaults (streamtrace[cluster]), loopback, one run: 3 workers started
as ``cluster up`` starts them (16 partitions, lease ttl 2 s, a checkpoint every 200 messages or
1 s), 20 streams pipelined; ``--runs`` times: kill -9 the worker owning the most partitions with
traffic, send the next steps of every stream at once, and time the kill -> the first answer of
one of its partitions from another worker; then start a replacement and wait until the
partitions are spread evenly again.

    python bench/cluster_failover.py [--runs 5] [--streams 20] [--write]

``--write`` replaces the "cluster-failover" section of bench/RESULTS.md.
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
import cluster_harness as H                                  # noqa: E402
from cluster import Feed, cluster_run, failover              # noqa: E402
from streamtrace.cluster import NatsServer                   # noqa: E402

DEFAULTS = ("--partitions", "16", "--lease-ttl", "2.0", "--checkpoint-every", "200")   # `cluster up`'s


def measure(runs: int, streams: int, backlog: int) -> list[float]:
    tmp = Path(tempfile.mkdtemp(prefix="streamtrace-bench-failover-"))
    cfg = H.config(tmp, slots=2 * streams)
    srv = NatsServer(store_dir=str(tmp / "store")).start()
    workers, logs, out = [], [], []

    def add():
        p = H.start_worker(srv.url, cfg, *DEFAULTS, wait=False)
        workers.append((p, H.wait_joined(p, sink=logs)))
    with cluster_run(srv, workers, logs) as feeds:
        for _ in range(3):
            add()
        H.wait_balanced(srv.url, 3)
        feed = Feed(srv.url, streams, (runs + 1) * (backlog + 20) + 10)
        feeds.append(feed)
        feed.run(10)
        for i in range(runs):
            feed.run(20)                          # every partition answered lately: its owner known
            s, _, _ = failover(feed, workers, backlog)
            out.append(s)
            print(f"run {i + 1}: kill -9 -> first answer from the new owner {s:.2f} s", flush=True)
            workers[:] = [(p, w) for p, w in workers if p.poll() is None]
            add()
            H.wait_balanced(srv.url, 3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--backlog", type=int, default=30, help="steps per stream sent right after each kill")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    got = np.array(measure(args.runs, args.streams, args.backlog))
    md = "\n".join([
        "| measure | value |", "|---|---|",
        f"| failover at the defaults (lease ttl 2 s, heartbeat 0.5 s): kill -9 -> first answer from the new owner, "
        f"{args.runs} runs | {', '.join(f'{s:.2f}' for s in got)} s |",
        f"| median / max (target <= 3 s) | {np.median(got):.2f} / {got.max():.2f} s |"])
    import timing
    md += (f"\n\n{timing.machine_line('loopback', f'load average {os.getloadavg()[0]:.1f}')}: the cores shared by "
           "nats-server, 3 workers and the client (and other jobs); "
           f"{args.streams} streams pipelined, {args.backlog} steps of each sent right after each kill; 16 partitions, "
           "a checkpoint every 200 messages or 1 s. The time covers the lease running out (about one ttl after the "
           "dead worker's last write), the new owner's checkpoint restore and consumer, and the replay to the "
           "first answer.")
    print(md)
    if args.write:
        from results_file import write_section
        write_section("cluster-failover", "Worker failover at the defaults (`bench/cluster_failover.py`)", md)


if __name__ == "__main__":
    main()
