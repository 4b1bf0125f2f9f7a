"""When each key of a KV bucket was last written, as seen by this process: a watch on the
bucket, so that expiry clocks start when a write is *made*, not when it is next polled.

Expiry needs no shared clock (see lease.py): a contender counts a key expired once the
revision it saw has not changed for the ttl by its own clock. Polling starts that clock up to
one poll late; and a worker that only looks at a lease once the lease's owner stopped
heartbeating started the lease's clock a whole ttl late (failover took two ttls). A watch
delivers every write as it is stored, so the clocks of every lease and every heartbeat run
all the time, in parallel. A sighting can only come after the write was sent, so the clock
never starts early: the owner's own window (0.9 ttl from sending) still closes first.

The watch is an aid, not a dependency: while it is down (a broker away) the polls go on
feeding the same table, as before.
"""
from __future__ import annotations

import asyncio
import logging
import time

__all__ = ["Sightings", "follow"]

log = logging.getLogger("streamtrace.cluster")


class Sightings:
    """{key: (newest revision seen, when it was first seen)} by this process's monotonic clock.

    Parameters
    ----------
    ttl : seconds a revision may stay unchanged before its key counts as expired.
    clock : the monotonic clock (a parameter for tests).

    Example::

        >>> s = Sightings(ttl=2.0, clock=lambda: 10.0)
        >>> s.see("p.1", 5, now=10.0); s.expired("p.1", 5, now=11.0), s.expired("p.1", 5, now=12.0)
        (False, True)
        >>> s.see("p.1", 6, now=12.5); s.expired("p.1", 6, now=13.0), s.deadline(now=13.0)
        (False, 14.5)
    """

    def __init__(self, ttl: float, clock=time.monotonic):
        self.ttl, self.clock = ttl, clock
        self.seen: dict = {}

    def see(self, key, revision: int, now: float | None = None):
        """A sighting of ``key`` at ``revision``: a newer revision restarts its clock; an older
        one (a late delivery) changes nothing."""
        rev, _ = self.seen.get(key, (0, 0.0))
        if revision > rev:
            self.seen[key] = (revision, self.clock() if now is None else now)

    def forget(self, key=None):
        """Drop one key (deleted) or, with none, every sighting (after a reconnect: nobody could
        write while the broker was away, so every clock restarts)."""
        if key is None:
            self.seen.clear()
        else:
            self.seen.pop(key, None)

    def expired(self, key, revision: int, now: float) -> bool:
        """Whether ``key`` has stayed at ``revision`` for the ttl (seeing it now if it is new)."""
        self.see(key, revision, now)
        rev, first = self.seen[key]
        return rev == revision and now - first >= self.ttl

    def live(self, key, now: float) -> bool:
        """Whether ``key`` was written (by its newest revision seen) within the ttl."""
        seen = self.seen.get(key)
        return seen is not None and now - seen[1] < self.ttl

    def deadline(self, now: float) -> float | None:
        """The soonest moment after ``now`` at which a key seen so far expires (None: none)."""
        ends = [first + self.ttl for _, first in self.seen.values() if first + self.ttl > now]
        return min(ends) if ends else None


async def follow(kv, on_entry, retry_s: float = 1.0, values: bool = False):
    """Watch every key of ``kv`` and call ``on_entry(key, revision, deleted, value)`` for each
    write (value None unless ``values``), until cancelled; a watch that breaks is started again
    after ``retry_s``.

    Parameters: ``kv`` a nats-py KeyValue bucket; ``on_entry`` a plain function (called in the
    event loop); ``values`` whether to fetch each write's value too.

    Example (with ``nats-server -js`` running and the cluster's buckets created)::

        sightings = Sightings(ttl=2.0)
        kv = await nc.jetstream().key_value("st_workers")
        task = asyncio.create_task(follow(kv, lambda key, rev, deleted, _: sightings.see(key, rev)))
        ...
        task.cancel()
    """
    while True:
        watcher = None
        try:
            watcher = await kv.watchall(meta_only=not values)
            async for e in watcher:
                if e is not None:
                    on_entry(e.key, e.revision, e.operation in ("DEL", "PURGE"), e.value if values else None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a broker away: the polls go on meanwhile
            log.info("watch on %s: %s: %s", getattr(kv, "_name", "?"), type(e).__name__, e)
        finally:
            if watcher is not None:
                try:
                    await watcher.stop()
                except Exception:  # noqa: BLE001 - its subscription went with the connection
                    pass
        await asyncio.sleep(retry_s)
