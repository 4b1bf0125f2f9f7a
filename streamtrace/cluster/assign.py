"""Which live worker should own each partition: rendezvous hashing with even quotas.

Every worker computes the same answer from the same set of live workers, with no messages
between them. Quotas make the spread even (P // n or P // n + 1 each, so max - min <= 1);
rendezvous order makes it stable: a worker joining or leaving moves few partitions.
"""
from __future__ import annotations

import hashlib

__all__ = ["assign", "score"]


def score(partition: int, worker: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{partition}/{worker}".encode(), digest_size=8).digest(), "big")


def assign(partitions: int, workers) -> dict[int, str]:
    """{partition: worker} over ``workers`` (any iterable of ids; empty: {})."""
    ws = sorted(set(workers))
    if not ws:
        return {}
    q, r = divmod(partitions, len(ws))
    # who gets the r larger quotas is decided by a hash too, not by name order
    order = sorted(ws, key=lambda w: score(-1, w), reverse=True)
    quota = {w: q + (1 if i < r else 0) for i, w in enumerate(order)}
    # strongest (partition, worker) preferences first: a partition goes to its best worker with room left
    prefs = sorted(((score(k, w), k, w) for k in range(partitions) for w in ws), reverse=True)
    owner: dict[int, str] = {}
    for _, k, w in prefs:
        if k not in owner and quota[w] > 0:
            owner[k] = w
            quota[w] -= 1
    return owner
