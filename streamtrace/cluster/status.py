"""``streamtrace cluster status``: partitions -> owner, epoch, lag, checkpoint age; the live workers.

A worker is listed while its heartbeat is younger than its lease ttl (+ 1 s for clocks that
differ between machines): a killed worker drops out within that, and the server removes its key
after ``log.WORKERS_TTL_S``. An owner whose heartbeat is not live is marked ``(silent)``.
"""
from __future__ import annotations

import json
import time

from . import jetstream as L
from .lease import lease_key

__all__ = ["gather", "format_status", "is_live"]


async def gather(nc) -> dict:
    from nats.js.errors import KeyNotFoundError, NoKeysError, NotFoundError
    js = nc.jetstream(timeout=5.0)
    P = await L.read_partitions(js)
    leases, workers = await js.key_value(L.LEASES), await js.key_value(L.WORKERS)
    now, parts = time.time(), []
    for k in range(P):
        try:
            v = json.loads((await leases.get(lease_key(k))).value)
        except KeyNotFoundError:
            v = {"owner": "", "epoch": 0, "seq": 0, "ckpt_t": 0}
        lag, acked = None, None
        if v["epoch"]:
            try:
                info = await js.consumer_info(L.LOG_STREAM, f"p{k}-e{v['epoch']}")
                lag, acked = info.num_pending + info.num_ack_pending, info.ack_floor.stream_seq
                # the lease again, read after the ack floor: an owner acks only what a committed
                # checkpoint covers, so the checkpoint shown is never older than the acks shown
                # (read before them, a commit and its ack in between showed acks past it)
                again = json.loads((await leases.get(lease_key(k))).value)
                v = again if again["epoch"] == v["epoch"] else v
            except (NotFoundError, KeyNotFoundError):
                pass
        parts.append({"partition": k, "owner": v["owner"] or "-", "epoch": v["epoch"], "checkpoint_seq": v["seq"],
                      "checkpoint_age_s": round(now - v["ckpt_t"], 1) if v.get("ckpt_t") else None,
                      "lag": lag, "acked_seq": acked, "owners_so_far": v["epoch"]})
    try:
        names = await workers.keys()
    except NoKeysError:
        names = []
    ws, silent = {}, []
    for name in names:
        try:
            w = json.loads((await workers.get(name)).value)
        except KeyNotFoundError:
            continue
        w["age_s"] = round(max(now - w.get("t", 0.0), 0.0), 1)
        if is_live(w, now):
            ws[name] = w
        else:
            silent.append(name)
    for p in parts:
        p["live"] = p["owner"] in ws
    return {"partitions": parts, "workers": ws, "silent_workers": sorted(silent)}


def is_live(heartbeat: dict, now: float) -> bool:
    """Whether a heartbeat (its wall time ``t``, the worker's lease ``ttl``) is recent enough.

    Example::

        >>> is_live({"t": 100.0, "ttl": 2.0}, now=102.5), is_live({"t": 100.0, "ttl": 2.0}, now=103.5)
        (True, False)
    """
    return now - heartbeat.get("t", 0.0) <= heartbeat.get("ttl", 2.0) + 1.0


def format_status(st: dict) -> str:
    lines = [f"{'part':>4} {'owner':<32} {'epoch':>5} {'ckpt seq':>9} {'ckpt age':>9} {'lag':>6}"]
    for p in st["partitions"]:
        age = "-" if p["checkpoint_age_s"] is None else f"{p['checkpoint_age_s']:.1f}s"
        owner = p["owner"] if p.get("live", True) or p["owner"] == "-" else p["owner"] + " (silent)"
        lines.append(f"{p['partition']:>4} {owner:<32} {p['epoch']:>5} {p['checkpoint_seq']:>9} {age:>9} "
                     f"{'-' if p['lag'] is None else p['lag']:>6}")
    lines.append("")
    lines.append(f"{len(st['workers'])} worker(s):")
    for name, w in sorted(st["workers"].items()):
        c = w.get("counters", {})
        lines.append(f"  {name}: heartbeat {w['age_s']:.1f}s ago, {w.get('streams', '?')} streams, owns "
                     f"{w.get('owned')}, log holes {c.get('log_holes', 0)}, damaged checkpoints "
                     f"{c.get('checkpoints_damaged', 0)}, published {c.get('published', 0)}, refused "
                     f"{c.get('refused', 0)}, checkpoints {c.get('checkpoints', 0)}, restores {c.get('restores', 0)}, "
                     f"leases lost {c.get('leases_lost', 0)}, publishes withheld {c.get('publishes_withheld', 0)}")
    if st.get("silent_workers"):
        lines.append(f"silent (not listed: no heartbeat within their lease ttl): {', '.join(st['silent_workers'])}")
    return "\n".join(lines)
