"""Helpers for the cluster tests: a real nats-server on loopback, workers as child processes,
a single-process reference engine fed the same messages one at a time."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np

from streamtrace.engine.launch import write_config
from streamtrace.engine.config import load_config
from streamtrace.engine.core import EngineCore

P = 8           # partitions
TTL = 1.5       # lease ttl (s)


def config(tmp: Path, slots: int = 16) -> Path:
    return write_config(tmp / "engine.toml", {
        "model": {"stack": "gru", "n_in": 1, "n_hidden": 8, "n_out": 1},
        "learning": {"algorithm": "d-rtrl", "mode": "forecast", "lr": 0.01},
        "engine": {"slots": slots, "shared_weights": False, "idle_timeout_s": 3600.0}})


def signals(streams: int, steps: int):
    t = np.arange(steps)
    return {f"s{i}": (np.sin(0.07 * (i + 1) * t + i) + 0.1 * np.cos(0.31 * t)).astype(np.float32)[:, None]
            for i in range(streams)}


def reference(cfg_path: Path, data: dict):
    """Every (stream, seq)'s prediction and every stream's final slot state from one engine,
    one message per call, streams interleaved."""
    from streamtrace import wire
    from streamtrace.transport.client import decode_reply
    core = EngineCore(load_config(cfg_path))
    preds = {}
    steps = len(next(iter(data.values())))
    for t in range(steps):
        for name, xs in data.items():
            out = core.ingest(wire.data_message(name, t, xs[t])) or core.tick()
            body = next(b for _, topic, b in out if topic.startswith(b"pred/"))
            preds[(name, t)] = decode_reply(body)["pred"]
    states = {n: dict((jax.tree_util.keystr(p), a) for p, a in
                      jax.tree_util.tree_flatten_with_path(core.learner.read_slot(st.slot))[0])
              for n, st in core.streams.items()}
    return preds, states


def start_worker(url: str, cfg_path: Path, *extra: str, wait: bool = True, prefix=()) -> subprocess.Popen:
    """A worker process (``prefix``: argv before Python's, e.g. ``ip netns exec NS``)."""
    cmd = [*prefix, sys.executable, "-m", "streamtrace", "worker", "--nats", url, "--config", str(cfg_path),
           "--partitions", str(P), "--lease-ttl", str(TTL), "--checkpoint-every", "20", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if wait:
        wait_joined(proc)
    return proc


def wait_joined(proc, timeout_s: float = 120.0, sink: list | None = None) -> str:
    """The worker's id, once it printed that it joined; its output keeps being drained (into ``sink``)."""
    import queue
    lines: queue.Queue = queue.Queue()

    def drain():
        for line in proc.stdout:
            lines.put(line)
            if sink is not None:
                sink.append(line)
        lines.put(None)
    threading.Thread(target=drain, daemon=True).start()
    deadline, seen = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if "joined" in line:
            return line.split("joined")[0].split()[-1].rstrip(":")
    proc.kill()
    raise AssertionError(f"worker did not join within {timeout_s} s (exit {proc.poll()}): {''.join(seen[-20:])}")


def status(url: str, creds=None) -> dict:
    """What ``streamtrace cluster status`` shows, as data."""
    import asyncio

    from streamtrace.cluster import jetstream as L
    from streamtrace.cluster.status import gather

    async def look():
        nc = await L.connect(url, creds)
        try:
            return await gather(nc)
        finally:
            await nc.close()
    return asyncio.run(look())


def live_worker(url: str, worker: str, timeout_s: float = 30.0) -> dict:
    """``worker``'s heartbeat as status lists it, once it is live (a worker just resumed from a
    pause, on a loaded machine, may take a few heartbeats); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        ws = status(url)["workers"]
        if worker in ws or time.monotonic() > deadline:
            assert worker in ws, f"worker {worker} not live after {timeout_s} s: {sorted(ws)}"
            return ws[worker]
        time.sleep(0.5)


def wait_balanced(url: str, workers: int, timeout_s: float = 60.0, creds=None) -> dict:
    """Partition counts per owner once every partition is owned by one of ``workers`` live
    workers and the spread is even (max - min <= 1); fails after ``timeout_s``."""
    from nats.js.errors import NotFoundError
    deadline, counts = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        try:
            st = status(url, creds)
        except NotFoundError:         # no worker has created the log yet
            time.sleep(0.3)
            continue
        owners = [p["owner"] for p in st["partitions"]]
        counts = {w: owners.count(w) for w in set(owners)}
        if "-" not in counts and len(counts) == workers and max(counts.values()) - min(counts.values()) <= 1:
            return counts
        time.sleep(0.3)
    raise AssertionError(f"partitions not spread evenly over {workers} workers within {timeout_s} s: {counts}")


def send_steps(client, data: dict, t0: int, t1: int):
    for t in range(t0, t1):
        for name, xs in data.items():
            client.send(xs[t], stream=name, seq=t)


def collect(client, want: set, deadline_s: float = 60.0) -> dict:
    got, deadline = {}, time.monotonic() + deadline_s
    while want - set(got) and time.monotonic() < deadline:
        try:
            a = client.recv(timeout_s=1.0)
        except TimeoutError:
            continue
        assert a["type"] == "prediction", a
        got[(a["stream"], a["seq"])] = a
    missing = want - set(got)
    assert not missing, f"{len(missing)} steps never answered, e.g. {sorted(missing)[:5]}"
    return got


async def _read_object(obj, name: str, tries: int = 6) -> bytes:
    """An object's bytes, asked again when a request goes unanswered: just after a broker is
    killed, creating the read's consumer timed out once in CI (30 s) while the streams elected
    leaders again; a new request is answered."""
    import asyncio

    import nats.errors
    for attempt in range(tries):
        try:
            return (await obj.get(name)).data
        except nats.errors.TimeoutError:
            if attempt == tries - 1:
                raise
            await asyncio.sleep(1.0)


def final_states(url: str, stepper_cfg: Path) -> dict:
    """Every stream's state from the committed partition checkpoints (the workers released them)."""
    import asyncio
    import json

    from streamtrace.cluster import jetstream as L
    from streamtrace.cluster.lease import lease_key
    from streamtrace.learner.checkpoint import loads_checkpoint

    async def main():
        nc = await L.connect(url)
        js = nc.jetstream(timeout=10)   # a broker may have just been killed: its election takes seconds
        kv, obj = await js.key_value(L.LEASES), await js.object_store(L.CHECKPOINTS)
        states = {}
        for k in range(P):
            v = json.loads((await kv.get(lease_key(k))).value)
            assert v["owner"] == "", f"partition {k} still owned by {v['owner']} after every worker left"
            if v["ckpt"]:
                arrays, header = loads_checkpoint(await _read_object(obj, v["ckpt"]), v["ckpt"])
                for i, (name, _) in enumerate(header["extra"]["streams"]):
                    n = sum(1 for a in arrays if a.startswith(f"s{i}."))
                    states[name] = [arrays[f"s{i}.{j}"] for j in range(n)]
        await nc.close()
        return states
    return asyncio.run(main())


def assert_same(got: dict, ref_preds: dict, states: dict, ref_states: dict):
    for key, a in got.items():
        assert a["pred"].tobytes() == ref_preds[key].tobytes(), f"{key}: {a['pred']} != {ref_preds[key]}"
    assert set(states) == set(ref_states), (sorted(states), sorted(ref_states))
    for name, leaves in ref_states.items():
        assert len(states[name]) == len(leaves)
        for a, (path, b) in zip(states[name], leaves.items()):
            a, b = np.asarray(a), np.asarray(b)
            if path == "['stats']['counters']":
                # [0] counts the calls the slot took part in, active or idle (a statistic: one engine
                # stepping every stream makes more calls than a worker holding a few); the rest is state
                a, b = a[1:], b[1:]
            assert a.tobytes() == b.tobytes(), f"stream {name}: final {path} differs: {a} != {b}"


def terminate(procs, timeout_s: float = 60.0) -> list:
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            p.terminate()
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout_s))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("hung")
    return codes


async def log_leader(url: str) -> tuple[str, int]:
    """(the name of the log's leader broker, the log's replicas), creating the log if missing."""
    from streamtrace.cluster import jetstream as L
    nc = await L.connect(url)
    js = nc.jetstream(timeout=10)
    await L.ensure_log(js, P, replicas=3)
    info = await js.stream_info(L.LOG_STREAM)
    await nc.close()
    return info.cluster.leader, info.config.num_replicas


async def publish_acked(js, subject, raw, msg_id, deadline):
    """Publish until JetStream acknowledges (a resend within the duplicate window is stored once)."""
    import asyncio

    import nats.errors
    from nats.js.errors import APIError, NoStreamResponseError
    while True:
        try:
            return await js.publish(subject, raw, timeout=1.0, headers={"Nats-Msg-Id": msg_id})
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, NoStreamResponseError, APIError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def sensor(url, data, fault_at, fault, deadline_s: float = 45.0, audit: dict | None = None,
                 pace_s: float = 0.0):
    """Publish every step (acknowledged, resent until stored; ``pace_s`` apart), call ``fault()``
    at step ``fault_at``, collect the answers once each: ({(stream, seq): answer}, ack times, log
    messages stored). With ``audit`` (a dict), also every answer as it came, duplicates too
    (``audit["answers"]``: (answer, headers)) and every lease write (``audit["leases"]``: (wall
    time seen, partition, epoch)), for :func:`assert_fenced`."""
    import asyncio
    import json

    from streamtrace import wire
    from streamtrace.cluster import jetstream as L
    from streamtrace.transport.client import decode_reply
    nc = await L.connect(url)
    js = nc.jetstream(timeout=10)
    answers, acks, steps = {}, [], len(next(iter(data.values())))
    audit = {} if audit is None else audit
    audit.setdefault("answers", [])
    audit.setdefault("leases", [])

    async def on_answer(msg):
        a = decode_reply(msg.data)
        answers.setdefault((a["stream"], a["seq"]), a)
        audit["answers"].append((a, dict(msg.headers or {})))
    await nc.subscribe("st.out.*", cb=on_answer)
    await nc.subscribe("st.err.*", cb=on_answer)

    async def watch_leases():
        kv = await js.key_value(L.LEASES)
        async for e in await kv.watchall():
            if e is not None and e.value:
                audit["leases"].append((time.time(), int(e.key[2:]), json.loads(e.value)["epoch"]))
    watching = asyncio.create_task(watch_leases())
    deadline = time.monotonic() + deadline_s
    for t in range(steps):
        if t == fault_at:
            fault()
        for name, xs in data.items():
            await publish_acked(js, L.in_subject(name), wire.data_message(name, t, xs[t]), f"{name}:{t}", deadline)
            acks.append(time.monotonic())
        await asyncio.sleep(pace_s)
    want = {(n, t) for n in data for t in range(steps)}
    while want - set(answers) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stored = (await js.stream_info(L.LOG_STREAM)).state.messages
    watching.cancel()
    await nc.close()
    return answers, acks, stored


def assert_fenced(audit: dict, ref_preds: dict):
    """Every answer published, duplicates included, is one engine's prediction, and none was
    published (its ``St-Sent``) after the sensor saw a later epoch of its partition taken over:
    a fenced owner published nothing after its lease. Returns how many answers were checked."""
    taken: dict = {}                      # (partition, epoch) -> when the sensor first saw it
    for t, k, e in audit["leases"]:
        taken.setdefault((k, e), t)
    for a, h in audit["answers"]:
        assert a["type"] == "prediction", a
        assert a["pred"].tobytes() == ref_preds[(a["stream"], a["seq"])].tobytes(), (a, h)
        k, e, sent = int(h["St-Partition"]), int(h["St-Epoch"]), float(h["St-Sent"])
        later = [t for (kk, ee), t in taken.items() if kk == k and ee > e]
        assert not later or sent < min(later), f"published at {sent} after epoch {e} of partition {k} was taken over"
    return len(audit["answers"])
