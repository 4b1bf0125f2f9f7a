"""Partition ownership: leases in a KV bucket, compare-and-set on the KV revision.

A lease is the key ``p.<k>`` holding {owner, epoch, ckpt, seq, sha, prev, streams}: who owns
partition k, how many streams it holds (the weight the assignment balances: assign.py), how
many owners it has had (the epoch, carried by every prediction), the checkpoint that covers the log up to ``seq`` with the SHA-256 of its bytes, and the checkpoint committed
before it (``prev``: {ckpt, seq, sha}), what a damaged checkpoint falls back to. Every write of an owner is ``update(last=revision)``: the
server refuses it once anyone else wrote the key, so the KV revision is the fencing token and a
checkpoint commit by a worker that lost its lease while paused is refused, not applied.

Expiry needs no shared clock: an owner counts its lease valid until (time it *sent* the last
successful write) + 0.9 ttl; a contender counts it expired once the revision it *saw* has not
changed for ttl by its own clock. The owner's window closes first, so it stops acting as
owner (publishing, acking) before anyone can take over. The contender's clocks run for every
partition all the time (``see``, fed by a watch on the bucket: watch.py), not only from when it
first wants a partition.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from .watch import Sightings

__all__ = ["Lease", "LeaseTable", "lease_key", "LeaseLost"]

SAFETY = 0.9


class LeaseLost(RuntimeError):
    """The lease was taken over (a compare-and-set refused): stop acting as owner."""


def lease_key(k: int) -> str:
    return f"p.{k}"


@dataclass
class Lease:
    partition: int
    epoch: int
    revision: int            # the fencing token: the next write must name it
    valid_until: float       # local monotonic time
    ckpt: str | None         # object name of the checkpoint covering the log up to seq
    seq: int                 # last log sequence the checkpoint covers (0: none)
    ckpt_t: float = 0.0      # wall time of that checkpoint's commit (for `cluster status`)
    sha: str | None = None   # SHA-256 (hex) of the checkpoint's bytes
    prev: dict | None = None     # the checkpoint committed before: {ckpt, seq, sha}
    streams: int = 0             # streams the partition holds (written with every renewal)
    # one write at a time: a renewal while a checkpoint commits in the background would name the
    # same revision, and the server would refuse the second as if the lease had been taken over
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)

    def valid(self, now: float) -> bool:
        return now < self.valid_until


class LeaseTable:
    """Acquire / renew / commit / release leases for one worker."""

    def __init__(self, kv, worker: str, ttl_s: float, clock=time.monotonic):
        self.kv, self.worker, self.ttl, self.clock = kv, worker, ttl_s, clock
        self.sightings = Sightings(ttl_s, clock)     # partition -> (revision, when first seen)
        self.weights: dict[int, int] = {}              # partition -> streams, as its lease last said

    def forget_observations(self):
        """After a reconnect: nobody could renew while the broker was away, so restart the clocks."""
        self.sightings.forget()

    def see(self, key: str, revision: int, value: bytes | None = None):
        """A write of the lease ``key`` (``p.<k>``) seen by a watch: partition k's clock restarts
        and its weight (streams) is noted."""
        if key.startswith("p.") and key[2:].isdigit():
            self.sightings.see(int(key[2:]), revision)
            try:
                self.weights[int(key[2:])] = int(json.loads(value)["streams"])
            except (TypeError, ValueError, KeyError):
                pass               # no value (a delete) or a lease written before weights

    async def read(self, k: int):
        """(revision, value) of partition k's lease, or (0, None) if never written."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError
        try:
            e = await self.kv.get(lease_key(k))
        except (KeyNotFoundError, KeyDeletedError):
            return 0, None
        return e.revision, json.loads(e.value)

    def expired(self, k: int, revision: int, now: float) -> bool:
        return self.sightings.expired(k, revision, now)

    async def try_acquire(self, k: int) -> Lease | None:
        """The lease if it is free, released or expired (and the compare-and-set wins)."""
        from nats.js.errors import KeyWrongLastSequenceError
        now = self.clock()
        rev, val = await self.read(k)
        if val is not None and val["owner"] and not self.expired(k, rev, now):
            return None
        val = val or {"owner": "", "epoch": 0, "ckpt": None, "seq": 0}
        new = {"owner": self.worker, "epoch": val["epoch"] + 1, "ckpt": val["ckpt"], "seq": val["seq"],
               "ckpt_t": val.get("ckpt_t", 0.0), "sha": val.get("sha"),
               "prev": val["prev"] if isinstance(val.get("prev"), dict) else None,
               "prev_owner": val["owner"], "t": time.time(), "streams": val.get("streams", 0)}
        sent = self.clock()
        try:
            revision = await self.kv.update(lease_key(k), json.dumps(new).encode(), last=rev)
        except KeyWrongLastSequenceError:
            return None
        return Lease(k, new["epoch"], revision, sent + SAFETY * self.ttl, new["ckpt"], new["seq"], new["ckpt_t"],
                     new["sha"], new["prev"], val.get("streams", 0))

    async def _write(self, lease: Lease, owner: str, ckpt: str | None, seq: int | None, sha: str | None = None):
        """ckpt / seq None: keep the lease's own, read under the lock (a commit may be changing them)."""
        async with lease.lock:
            if ckpt is None:
                ckpt, sha = lease.ckpt, lease.sha
            await self._write_now(lease, owner, ckpt, lease.seq if seq is None else seq, sha)

    async def _write_now(self, lease: Lease, owner: str, ckpt: str | None, seq: int, sha: str | None):
        from nats.js.errors import KeyWrongLastSequenceError
        new_ckpt = ckpt != lease.ckpt
        ckpt_t = time.time() if new_ckpt else lease.ckpt_t
        prev = {"ckpt": lease.ckpt, "seq": lease.seq, "sha": lease.sha} if new_ckpt and lease.ckpt else lease.prev
        val = {"owner": owner, "epoch": lease.epoch, "ckpt": ckpt, "seq": seq, "t": time.time(), "ckpt_t": ckpt_t,
               "sha": sha, "prev": prev, "streams": lease.streams}
        for _ in range(3):
            sent = self.clock()
            try:
                lease.revision = await self.kv.update(lease_key(lease.partition), json.dumps(val).encode(),
                                                      last=lease.revision)
                break
            except KeyWrongLastSequenceError:
                pass
            # Refused. A write of ours whose answer was lost (the broker died after storing it, or
            # stored it after we had timed out) also moves the revision on. Only this worker writes
            # its own name at this epoch (a takeover writes a new epoch, a release owner ""), so a
            # lease that still reads so is ours: write again on its revision. Anything else: taken over.
            rev, cur = await self.read(lease.partition)
            now_at = (cur["owner"], cur["epoch"]) if cur else None
            if owner == "" and now_at == ("", lease.epoch):
                lease.revision = rev                  # our own release got through
                break
            if now_at != (self.worker, lease.epoch) or rev == lease.revision:
                lease.valid_until = 0.0
                raise LeaseLost(f"partition {lease.partition}: lease (epoch {lease.epoch}) was taken over")
            lease.revision = rev
        else:
            lease.valid_until = 0.0
            raise LeaseLost(f"partition {lease.partition}: lease (epoch {lease.epoch}) kept moving under its owner")
        lease.valid_until = sent + SAFETY * self.ttl
        lease.ckpt, lease.seq, lease.ckpt_t, lease.sha, lease.prev = ckpt, seq, ckpt_t, sha, prev

    async def renew(self, lease: Lease, ckpt: str | None = None, seq: int | None = None, sha: str | None = None):
        """Extend the lease; with ckpt/seq/sha also commit a checkpoint (the one it replaces
        becomes ``prev``). Raises LeaseLost."""
        await self._write(lease, self.worker, ckpt, seq, sha)

    async def release(self, lease: Lease, ckpt: str | None = None, seq: int | None = None):
        """Hand the partition back (owner ""), with the final checkpoint. Raises LeaseLost."""
        await self._write(lease, "", ckpt, seq)
        lease.valid_until = 0.0

    async def release_named(self, partitions) -> list[int]:
        """Release every lease among ``partitions`` that still names this worker, as it stands
        (its committed checkpoint kept). Only for a worker that holds no lease any more: a
        takeover whose answer was lost, or a release that never got through, left its name there."""
        from nats.js.errors import KeyWrongLastSequenceError
        released = []
        for k in partitions:
            while True:
                rev, val = await self.read(k)
                if val is None or val["owner"] != self.worker:
                    break
                try:
                    await self.kv.update(lease_key(k), json.dumps(dict(val, owner="", t=time.time())).encode(),
                                         last=rev)
                    released.append(k)
                    break
                except KeyWrongLastSequenceError:
                    continue              # written meanwhile (a late write of ours, or a takeover): look again
        return released
