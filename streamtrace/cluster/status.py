"""``streamtrace cluster status``: partitions -> owner, epoch, lag, checkpoint age; workers."""
from __future__ import annotations

import json
import time

from . import log as L
from .lease import lease_key

__all__ = ["gather", "format_status"]


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
            except NotFoundError:
                pass
        parts.append({"partition": k, "owner": v["owner"] or "-", "epoch": v["epoch"], "checkpoint_seq": v["seq"],
                      "checkpoint_age_s": round(now - v["ckpt_t"], 1) if v.get("ckpt_t") else None,
                      "lag": lag, "acked_seq": acked, "owners_so_far": v["epoch"]})
    try:
        names = await workers.keys()
    except NoKeysError:
        names = []
    ws = {}
    for name in names:
        try:
            ws[name] = json.loads((await workers.get(name)).value)
        except KeyNotFoundError:
            pass
    return {"partitions": parts, "workers": ws}


def format_status(st: dict) -> str:
    lines = [f"{'part':>4} {'owner':<32} {'epoch':>5} {'ckpt seq':>9} {'ckpt age':>9} {'lag':>6}"]
    for p in st["partitions"]:
        age = "-" if p["checkpoint_age_s"] is None else f"{p['checkpoint_age_s']:.1f}s"
        lines.append(f"{p['partition']:>4} {p['owner']:<32} {p['epoch']:>5} {p['checkpoint_seq']:>9} {age:>9} "
                     f"{'-' if p['lag'] is None else p['lag']:>6}")
    lines.append("")
    lines.append(f"{len(st['workers'])} worker(s):")
    for name, w in sorted(st["workers"].items()):
        c = w.get("counters", {})
        lines.append(f"  {name}: owns {w.get('owned')}, published {c.get('published', 0)}, refused "
                     f"{c.get('refused', 0)}, checkpoints {c.get('checkpoints', 0)}, restores {c.get('restores', 0)}, "
                     f"leases lost {c.get('leases_lost', 0)}, publishes withheld {c.get('publishes_withheld', 0)}")
    return "\n".join(lines)
