"""A cluster worker: joins through NATS, owns the partitions the even rendezvous assignment
gives it among the live workers, and hands them over cleanly on SIGTERM.

Membership: each worker writes a heartbeat to ``st_workers`` every ``heartbeat_s``; a worker
is live while its heartbeat's revision keeps changing (by the observer's own clock) and gone
once its key is deleted (SIGTERM) or silent for ``lease_ttl_s``. Every worker computes the
same assignment from the live set; it releases what is no longer its own and takes what is
and is free (released, or its lease expired). The assignment evens out the streams too, by
the count each lease carries (assign.py). Watches on both buckets (watch.py) start every
heartbeat's and every lease's expiry clock at the write itself, and the loop wakes when the
next one is due: a killed worker's partitions are taken over about one ttl after its last
writes, not two.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import signal
import socket
import time

from . import jetstream as L
from .assign import assign
from .lease import LeaseLost, LeaseTable
from .owner import PartitionOwner
from .stepper import Stepper
from .watch import Sightings, follow

__all__ = ["Worker", "COUNTERS"]

log = logging.getLogger("streamtrace.cluster")
COUNTERS = ("published", "refused", "checkpoints", "restores", "reloads", "released", "leases_lost",
            "leases_taken", "publishes_withheld", "redelivered_skipped", "hole_replays", "log_holes",
            "checkpoints_damaged", "delivery_gaps")


def worker_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:40]
    return f"{host}-{os.getpid()}-{secrets.token_hex(2)}"


class Worker:
    def __init__(self, url: str, cfg, *, creds: L.Credentials | None = None, lease_ttl_s: float = 2.0,
                 heartbeat_s: float = 0.5, ckpt_every: int = 200, ckpt_interval_s: float = 1.0,
                 poll_s: float = 0.25, partitions: int | None = None, wid: str | None = None,
                 prometheus_port: int = 0, leave_timeout_s: float = 10.0, replicas: int = 1):
        self.url, self.creds, self.partitions, self.replicas = url, creds, partitions, replicas
        self.cfg, self.stepper = cfg, None
        self.id = wid or worker_id()
        self.lease_ttl, self.heartbeat_s, self.poll_s = lease_ttl_s, heartbeat_s, poll_s
        self.renew_margin = lease_ttl_s * 0.6     # renew once the validity left is below this
        self.ckpt_every, self.ckpt_interval_s = ckpt_every, ckpt_interval_s
        self.leave_timeout_s = leave_timeout_s     # how long leaving retries its releases (then: the ttl)
        self.owners: dict[int, tuple[PartitionOwner, asyncio.Task]] = {}
        self.seen_workers = Sightings(lease_ttl_s)     # heartbeat key -> (revision, when first seen)
        self.watches: list[asyncio.Task] = []
        self.prometheus_port = prometheus_port
        self.stop_event: asyncio.Event | None = None

    def _build(self):
        from ..engine.executables import ExecutableStore
        from ..engine.server import open_compile_cache
        folder = open_compile_cache(self.cfg.engine.compile_cache_dir)    # as `serve`: a restart loads, not compiles
        self.stepper = Stepper(self.cfg)
        self.stepper.core.learner.programs.store = ExecutableStore.for_config(folder, self.stepper.core.cfg)
        self.stepper.warmup()     # compiled before joining: a first message must not outlast the lease
        self.metrics = self.stepper.core.metrics
        for name in COUNTERS:
            self.metrics.counters.setdefault(name, 0)
        if self.prometheus_port:
            self.metrics.serve_prometheus(self.prometheus_port)

    def count(self, name: str, n: int = 1):
        self.metrics.count(name, n)

    # ---- life ---------------------------------------------------------------------------
    async def run(self, on_ready=None) -> int:
        self.stop_event = asyncio.Event()
        self.nc = await L.connect(self.url, self.creds, name=f"streamtrace-worker-{self.id}",
                                  reconnected_cb=self._reconnected)
        self._build()             # after connecting: wrong credentials fail fast, before compiling
        self.js = self.nc.jetstream(timeout=5.0)
        self.P = await L.ensure_log(self.js, self.partitions, replicas=self.replicas)
        self.leases = LeaseTable(await self.js.key_value(L.LEASES), self.id, self.lease_ttl)
        self.workers_kv = await self.js.key_value(L.WORKERS)
        self.objects = await self.js.object_store(L.CHECKPOINTS)
        await self._heartbeat()
        self.watches = [asyncio.create_task(follow(self.workers_kv, self._saw_worker)),
                        asyncio.create_task(follow(self.leases.kv, lambda key, rev, _, value: self.leases.see(
                            key, rev, value), values=True))]
        if on_ready:
            on_ready(self)
        try:
            next_beat = 0.0
            while not self.stop_event.is_set():
                try:
                    if time.monotonic() >= next_beat:
                        next_beat = time.monotonic() + self.heartbeat_s
                        await self._heartbeat()
                    await self._rebalance()
                except Exception as e:  # noqa: BLE001 - broker away: keep trying, the owners stop on their own
                    log.info("worker %s: %s: %s", self.id, type(e).__name__, e)
                try:
                    await asyncio.wait_for(self.stop_event.wait(), self._until_next(next_beat))
                except asyncio.TimeoutError:
                    pass
        finally:
            for task in self.watches:
                task.cancel()
            await self._leave()
        return 0

    def _saw_worker(self, key: str, revision: int, deleted: bool, _value=None):
        if deleted:
            self.seen_workers.forget(key)
        else:
            self.seen_workers.see(key, revision)

    def _until_next(self, next_beat: float) -> float:
        """Seconds to sleep: until the next heartbeat, or sooner, just past the moment a
        heartbeat or a lease seen so far expires (a takeover is then due)."""
        now = time.monotonic()
        due = [next_beat] + [d + 0.01 for d in (self.seen_workers.deadline(now), self.leases.sightings.deadline(now))
                             if d is not None]
        return min(max(min(due) - now, 0.01), self.heartbeat_s)

    async def _reconnected(self):
        self.leases.forget_observations()
        self.seen_workers.forget()

    def request_stop(self):
        if self.stop_event is not None:
            self.stop_event.set()

    async def _leave(self):
        """SIGTERM: checkpoint and release every partition, then leave the membership. After a
        broker restart the releases are retried until the broker answers (``leave_timeout_s`` at
        most; what is left then expires by the ttl), and any lease that still names this worker
        (a write whose answer was lost landed after all) is released as it stands."""
        deadline = time.monotonic() + self.leave_timeout_s
        for k in list(self.owners):
            await self._drop(k, deadline)
        while True:
            try:
                strays = await asyncio.wait_for(self.leases.release_named(range(self.P)),
                                                max(deadline - time.monotonic(), 0.01))
                if strays:
                    log.info("worker %s: released partitions %s it no longer held", self.id, strays)
                break
            except Exception as e:  # noqa: BLE001 - broker still away: retry until the deadline
                if time.monotonic() + 0.2 >= deadline:
                    log.warning("worker %s: leases not checked on leaving (%s: %s); they expire by the ttl",
                                self.id, type(e).__name__, e)
                    break
                await asyncio.sleep(0.2)
        try:
            await self.workers_kv.delete(self.id)
        except Exception:  # noqa: BLE001 - the heartbeat then simply goes silent
            pass
        await self.nc.drain()

    # ---- membership and assignment ------------------------------------------------------
    async def _heartbeat(self):
        body = {"owned": sorted(self.owners), "counters": {k: self.metrics.counters[k] for k in COUNTERS},
                "streams": len(self.stepper.streams()), "pid": os.getpid(), "host": socket.gethostname(),
                "t": time.time(), "ttl": self.lease_ttl}
        await self.workers_kv.put(self.id, json.dumps(body).encode())

    async def live_workers(self) -> set[str]:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError, NoKeysError
        try:
            keys = await self.workers_kv.keys()
        except NoKeysError:
            keys = []
        live = {self.id}
        for key in keys:
            try:
                rev = (await self.workers_kv.get(key)).revision
            except (KeyNotFoundError, KeyDeletedError):
                continue
            now = time.monotonic()
            if not self.seen_workers.expired(key, rev, now):
                live.add(key)
        return live

    async def _rebalance(self):
        for k, (owner, task) in list(self.owners.items()):
            if task.done():            # lost its lease (or failed for good): forget it
                del self.owners[k]
        live = await self.live_workers()
        mine = {k for k, w in assign(self.P, live, self.leases.weights).items() if w == self.id}
        for k in set(self.owners) - mine:
            await self._drop(k)
        for k in sorted(mine - set(self.owners)):
            lease = await self.leases.try_acquire(k)
            if lease is not None:
                owner = PartitionOwner(self, lease)
                try:
                    await owner.load()
                except Exception:
                    await owner.release()
                    raise
                self.owners[k] = (owner, asyncio.create_task(owner.run()))
                self.count("leases_taken")
                log.info("worker %s owns partition %d (epoch %d, from seq %d)", self.id, k, lease.epoch, owner.applied)

    async def _drop(self, k: int, deadline: float | None = None):
        owner, task = self.owners.pop(k)
        owner.stopping = True
        await task
        try:
            await owner.release(deadline)
        except LeaseLost:
            self.count("leases_lost")
        except Exception as e:  # noqa: BLE001 - the lease then expires and a successor replays from the last commit
            log.warning("partition %d: release failed (%s: %s)", k, type(e).__name__, e)


def run_worker(url: str, cfg, **kw) -> int:
    """``streamtrace worker``: run until SIGTERM / SIGINT, then hand everything over and exit 0."""
    async def main():
        w = Worker(url, cfg, **kw)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, w.request_stop)
        return await w.run(on_ready=lambda w: print(f"streamtrace worker {w.id}: joined {w.url} "
                                                     f"({w.P} partitions)", flush=True))
    return asyncio.run(main())
