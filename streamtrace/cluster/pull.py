"""A continuous pull from one JetStream pull consumer: pull requests are kept outstanding
ahead of need, so a message is pushed to the worker the moment it is stored, without the
request round trip (and the no-wait probe) that each ``fetch`` call of nats-py costs.

Requests ask for ``batch`` messages and expire after ``expires_s``; a new one goes out when
fewer than half a batch remain requested, when the server says one ended (408 timeout, 409),
or when none answered for longer than it can live (a reconnect drops them silently).
"""
from __future__ import annotations

import asyncio
import collections
import json
import time

__all__ = ["Puller", "PullError"]


class PullError(RuntimeError):
    """The consumer is gone or refused the pull (409 other than a request that ended)."""


class Puller:
    def __init__(self, nc, stream: str, consumer: str, *, batch: int = 256, expires_s: float = 5.0):
        self.nc, self.batch, self.expires_s = nc, batch, expires_s
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.queue: collections.deque = collections.deque()     # None: the consumer failed (self.error)
        self.waiter: asyncio.Future | None = None      # set when a message arrives for a waiting next_batch
        self.requested, self.t_request, self.sub, self.error = 0, 0.0, None, None

    async def start(self):
        self.inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(self.inbox, cb=self._on_msg)
        await self._request()

    async def _request(self):
        body = json.dumps({"batch": self.batch, "expires": int(self.expires_s * 1e9)}).encode()
        self.requested += self.batch
        self.t_request = time.monotonic()
        await self.nc.publish(self.subject, body, reply=self.inbox)

    async def _on_msg(self, msg):
        status = msg.headers.get("Status") if msg.headers else None
        if status == "100":                  # idle heartbeat (not asked for; ignored)
            return
        if status is None:
            self.requested -= 1
            self._put(msg)
            return
        if status in ("408", "404"):        # a request ran out: ask again
            self.requested = 0
        elif status == "503":                # no responders: the consumer is gone (its broker died)
            self.error = PullError("pull refused: 503 no responders (the consumer is gone)")
            self._put(None)
        elif status == "409":
            desc = msg.headers.get("Description", "")
            if "Exceeded" in desc or "Timeout" in desc or "Batch Completed" in desc:
                self.requested = 0
            else:
                self.error = PullError(f"pull refused: 409 {desc}")
                self._put(None)

    def _put(self, msg):
        self.queue.append(msg)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next_batch(self, timeout_s: float, most: int = 256) -> list:
        """Messages waiting now, or the first to arrive within ``timeout_s`` (then any others queued)."""
        await self._top_up()
        if not self.queue:
            # a bare future woken by _on_msg: the owner resumes one hand-over after the message
            # (asyncio.wait_for on a queue's get would add a task of its own, two more per message)
            loop = asyncio.get_running_loop()
            self.waiter = waiter = loop.create_future()
            timer = loop.call_later(timeout_s, lambda: waiter.done() or waiter.set_result(None))
            try:
                await waiter
            finally:
                timer.cancel()
                self.waiter = None
            if not self.queue:
                await self._top_up()
                return []
        out = []
        while self.queue and len(out) < most:
            msg = self.queue.popleft()
            if msg is None:
                raise self.error
            out.append(msg)
        return out

    async def _top_up(self):
        stale = time.monotonic() - self.t_request > self.expires_s + 1.0
        if self.requested < self.batch // 2 or stale:
            if stale:
                self.requested = 0
            await self._request()

    async def stop(self):
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()
            except Exception:  # noqa: BLE001 - gone with a broker that went away
                pass
            self.sub = None
