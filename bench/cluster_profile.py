"""Where one sample's time goes through the cluster (streamtrace[cluster]): a step round trip cut
into stages by wall-clock stamps taken in the client, by JetStream (the stored message's
timestamp) and in the worker (a worker process whose methods are wrapped to stamp each message),
against a bare NATS request/reply echo through the same client in the same run. Loopback only.

    python bench/cluster_profile.py [--samples N]     (prints a table; --out FILE writes it)

Stages: client call -> publish handed to the client's NATS thread -> stored in the log ->
delivered to the worker's pull subscription -> taken by the partition's owner -> stepped ->
answer published -> answer read by the client's NATS thread -> returned to the caller.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_harness as H                                  # noqa: E402
from cluster import JsEcho, ProcessEcho, echo_latency        # noqa: E402
from streamtrace.cluster import ClusterClient, NatsServer    # noqa: E402

# Runs in the worker process: wraps the pull callback, the owner's per-message step and the
# stepper to stamp each log sequence, and writes the stamps at exit (SIGTERM: a clean leave).
WORKER = r"""
import json, sys, time
from nats.aio import transport
from streamtrace.cluster import owner, pull, stepper
stamps, current, last_read = {}, [None], [0.0]
read, writelines = transport.TcpTransport.read, transport.TcpTransport.writelines

async def stamped_read(self, n):
    data = await read(self, n)
    last_read[0] = time.time()
    return data

def stamped_writelines(self, payload):
    s = current[0]
    if s is not None and "published" in s and "written" not in s:
        s["written"] = time.time()
    return writelines(self, payload)
transport.TcpTransport.read, transport.TcpTransport.writelines = stamped_read, stamped_writelines
on_msg, apply, step = pull.Puller._on_msg, owner.PartitionOwner._apply, stepper.Stepper.step
commit, ckpt_times = owner.PartitionOwner._commit, []

async def timed_commit(self, *args):
    t = time.time()
    await commit(self, *args)
    ckpt_times.append([t, time.time()])
owner.PartitionOwner._commit = timed_commit

async def stamped_on_msg(self, msg):
    if not msg.headers or msg.headers.get("Status") is None:
        md = msg.metadata
        stamps[md.sequence.stream] = {"stored": md.timestamp.timestamp() if hasattr(md.timestamp, "timestamp")
                                      else None, "read": last_read[0], "delivered": time.time()}
    await on_msg(self, msg)

async def stamped_apply(self, msg):
    s = stamps.setdefault(msg.metadata.sequence.stream, {})
    s["taken"] = time.time()
    current[0] = s
    await apply(self, msg)
    s["published"] = time.time()

def stamped_step(self, raw, stream):
    current[0]["step_start"] = time.time()
    out = step(self, raw, stream)
    current[0]["step_end"] = time.time()
    return out

pull.Puller._on_msg, owner.PartitionOwner._apply, stepper.Stepper.step = stamped_on_msg, stamped_apply, stamped_step
out, sys.argv = sys.argv[1], ["streamtrace"] + sys.argv[2:]
from streamtrace.commands.cli import main
try:
    rc = main()
finally:
    with open(out, "w") as fh:
        json.dump({"stamps": stamps, "checkpoints": ckpt_times}, fh)
sys.exit(rc)
"""

STAGES = [("client call -> publish in the client's NATS thread", "t0", "sent"),
          ("-> stored in the JetStream log", "sent", "stored"),
          ("-> read from the worker's socket", "stored", "read"),
          ("-> handed to the pull subscription's callback (nats-py)", "read", "delivered"),
          ("-> taken by the partition's owner", "delivered", "taken"),
          ("-> step starts (lease checks)", "taken", "step_start"),
          ("engine step (Stepper.step)", "step_start", "step_end"),
          ("-> answer handed to the worker's NATS client", "step_end", "published"),
          ("-> written to the worker's socket", "published", "written"),
          ("-> read from the client's socket", "written", "client_read"),
          ("-> handed to the client's answer callback (nats-py)", "client_read", "answered"),
          ("-> returned to the caller", "answered", "t1")]


def client_side(url: str, n: int) -> list[dict]:
    """``n`` sequential ``ClusterClient.step`` calls; per step the client's stamps (the NATS thread's
    too: its publish and its reading of the answer) and the log sequence that served it."""
    c = ClusterClient(url, stream="prof", timeout_s=30)
    c.trace, stamps = [], {}
    publish, on_answer = c._publish, c._on_answer
    from nats.aio import transport
    read, last_read = transport.TcpTransport.read, [0.0]

    async def stamped_read(self, size):
        data = await read(self, size)
        last_read[0] = time.time()
        return data
    transport.TcpTransport.read = stamped_read

    async def stamped_publish(stream, raw, msg_id):
        stamps.setdefault(int(msg_id.rsplit(":", 1)[1]), {})["sent"] = time.time()
        await publish(stream, raw, msg_id)

    async def stamped_on_answer(msg):
        t = time.time()
        await on_answer(msg)
        seq = int(msg.headers["St-Log-Seq"]) - 1          # one stream in a fresh log: log seq = seq + 1
        stamps.setdefault(seq, {}).update(answered=t, client_read=last_read[0])
    c._publish, c._on_answer = stamped_publish, stamped_on_answer
    x, rows = np.array([0.3], np.float32), []
    for i in range(n + 30):
        t0 = time.time()
        a = c.step(x)
        t1 = time.time()
        if i >= 30:                          # the first ones warm the path up
            rows.append({"t0": t0, "t1": t1, "log_seq": a["seq"] + 1, **stamps[a["seq"]]})
    c.close()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="streamtrace-bench-profile-"))
    cfg = H.config(tmp, slots=64)
    srv = NatsServer(store_dir=str(tmp / "store")).start()
    stamps_file = tmp / "stamps.json"
    cmd = [sys.executable, "-c", WORKER, str(stamps_file), "worker", "--nats", srv.url, "--config", str(cfg),
           "--partitions", str(H.P), "--lease-ttl", str(H.TTL)]
    w = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        H.wait_joined(w)
        H.wait_balanced(srv.url, 1)
        echo = echo_latency(srv.url, args.samples)
        js, pecho = JsEcho(srv.url), ProcessEcho(srv.url)
        js(30), pecho(30)
        js_echo, process_echo = js(args.samples), pecho(args.samples)
        js.close(), pecho.close()
        rows = client_side(srv.url, args.samples)
    finally:
        assert H.terminate([w]) == [0]
        srv.kill()
    got = json.loads(stamps_file.read_text())
    stamps, ckpts = {int(k): v for k, v in got["stamps"].items()}, np.array(got["checkpoints"])
    for r in rows:
        r.update(stamps[r["log_seq"]])
    lines = [f"{len(rows)} sequential steps, one worker, loopback ({os.cpu_count()} CPUs shared by nats-server, the "
             "worker and this client); wall-clock stamps (us):", "",
             "| stage | p50 us | mean us |", "|---|---|---|"]
    for name, a, b in STAGES:
        d = np.array([r[b] - r[a] for r in rows if r.get(a) and r.get(b)]) * 1e6
        lines.append(f"| {name} | {np.median(d):.0f} | {d.mean():.0f} |")
    total = np.array([r["t1"] - r["t0"] for r in rows]) * 1e6
    lines.append(f"| **round trip** | **{np.median(total):.0f}** | {total.mean():.0f} (p99 "
                 f"{np.percentile(total, 99):.0f}) |")
    lines.append(f"| bare NATS request/reply echo, same client | {np.median(echo) * 1e6:.0f} | "
                 f"{echo.mean() * 1e6:.0f} (p99 {np.percentile(echo, 99) * 1e6:.0f}) |")
    lines.append(f"| bare NATS echo, the responder a process of its own | {np.median(process_echo) * 1e6:.0f} | "
                 f"{process_echo.mean() * 1e6:.0f} (p99 {np.percentile(process_echo, 99) * 1e6:.0f}) |")
    lines.append(f"| JetStream echo: the log and a Python pull consumer replying, no engine | "
                 f"{np.median(js_echo) * 1e6:.0f} | {js_echo.mean() * 1e6:.0f} (p99 {np.percentile(js_echo, 99) * 1e6:.0f}) |")
    t0, t1 = rows[0]["t0"], rows[-1]["t1"]
    during = ckpts[(ckpts[:, 0] >= t0) & (ckpts[:, 1] <= t1)] if len(ckpts) else np.zeros((0, 2))
    if len(during):
        d = (during[:, 1] - during[:, 0]) * 1e6
        hit = sum(1 for r in rows if any(a < r["t1"] and r["t0"] < b for a, b in during))
        lines.append(f"| checkpoints stored and committed meanwhile (in the background): {len(during)}, each | "
                     f"{np.median(d):.0f} | max {d.max():.0f}; {hit} of {len(rows)} steps overlapped one |")
    lines.append(f"\nratio p50: {np.median(total) / (np.median(echo) * 1e6):.2f}x the echo (responder a thread), "
                 f"{np.median(total) / (np.median(process_echo) * 1e6):.2f}x (responder a process)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
