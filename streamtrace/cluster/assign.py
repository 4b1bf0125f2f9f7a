"""Which live worker should own each partition: rendezvous hashing with even quotas, then
swaps that even out the streams each worker carries.

Every worker computes the same answer from the same set of live workers and the same
partition weights (how many streams each partition holds, as its owner writes it in the
lease), with no messages between them. Quotas make the partition counts even (P // n or
P // n + 1 each, so max - min <= 1); rendezvous order makes it stable: a worker joining or
leaving moves few partitions. Streams hash unevenly over partitions (20 streams over 16
partitions leave some with 3 and some with none), so an even partition count alone put 7-11
of 20 streams on one of 3 workers; the swaps then move load from the busiest worker to the
least busy one until they differ by at most one partition's worth.
"""
from __future__ import annotations

import hashlib

__all__ = ["assign", "score", "balance"]


def score(partition: int, worker: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{partition}/{worker}".encode(), digest_size=8).digest(), "big")


def assign(partitions: int, workers, weights: dict | None = None) -> dict[int, str]:
    """{partition: worker} over ``workers`` (any iterable of ids; empty: {}); with ``weights``
    ({partition: streams}, missing ones 0), balanced by them too (:func:`balance`).

    Example::

        >>> owner = assign(4, ["a", "b"], weights={0: 3, 1: 3, 2: 0, 3: 0})
        >>> sorted(sum(1 for k, w in owner.items() if w == x) for x in "ab")     # 2 partitions each
        [2, 2]
        >>> sorted(sum(3 for k, w in owner.items() if w == x and k < 2) for x in "ab")   # 3 streams each
        [3, 3]
    """
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
    return balance(owner, weights) if weights else owner


def balance(owner: dict[int, str], weights: dict) -> dict[int, str]:
    """``owner`` with partitions moved or swapped between the busiest and the least busy worker
    (by the sum of ``weights``) while that narrows their gap; a move only from a worker with more
    partitions than the other, so the partition counts stay within one. Deterministic: the same
    input gives the same output on every worker; each step lowers the sum of squared loads, so
    it ends.

    Example::

        >>> owner = balance({0: "a", 1: "a", 2: "b", 3: "b"}, {0: 2, 1: 2})    # a carried 4 streams, b none
        >>> sorted(owner.values()), owner[0] != owner[1]                        # 2 partitions and 2 streams each
        (['a', 'a', 'b', 'b'], True)
    """
    owner = dict(owner)
    ws = sorted(set(owner.values()))
    w8 = lambda k: int(weights.get(k, 0))        # noqa: E731
    while len(ws) > 1:
        load = {w: 0 for w in ws}
        count = {w: 0 for w in ws}
        for k, w in owner.items():
            load[w] += w8(k)
            count[w] += 1
        hi = max(ws, key=lambda w: (load[w], w))
        lo = min(ws, key=lambda w: (load[w], w))
        gap = load[hi] - load[lo]
        mine = sorted(k for k, w in owner.items() if w == hi)
        theirs = sorted(k for k, w in owner.items() if w == lo) + ([None] if count[hi] > count[lo] else [])
        best = None
        for a in mine:
            for b in theirs:
                d = w8(a) - (0 if b is None else w8(b))
                if 0 < d < gap and (best is None or abs(gap - 2 * d) < best[0]):
                    best = (abs(gap - 2 * d), a, b)
        if best is None:
            return owner
        _, a, b = best
        owner[a] = lo
        if b is not None:
            owner[b] = hi
    return owner
