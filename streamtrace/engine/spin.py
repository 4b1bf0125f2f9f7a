"""Busy polling: after traffic the engine loop polls its sockets without sleeping for a while.

A blocked poll costs a wake-up per message (the kernel's scheduler, then cold caches for the
Python that reads, steps and replies); polling for ~1 ms after each burst cut a one-sensor
round trip's median nearly in half (one GRU-64 sensor over ipc). The spin period bounds the
cost: an idle engine sleeps as before, a 100 Hz sensor keeps ~10% of one CPU busy, a stream of 1 kHz or
more one whole CPU, unless other work wants that CPU: each empty poll yields it first. An
engine that may run on one CPU only never spins: it would take that CPU from the sender and
from XLA.
"""
from __future__ import annotations

import os

__all__ = ["BusyPoll"]

IDLE_MS = 50     # a blocked poll's timeout: how often an idle loop does its timed chores


class BusyPoll:
    """Poll without sleeping for ``spin_us`` after traffic (engine.busy_poll_us; 0: off)."""

    def __init__(self, spin_us: int, cpus: int | None = None):
        cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
        self.spin_s = spin_us / 1e6 if cpus > 1 else 0.0
        self._until = float("-inf")

    def busy(self, now: float):
        """Traffic was handled at ``now``: keep polling until the spin period has passed."""
        self._until = now + self.spin_s

    def active(self, now: float) -> bool:
        """Inside the spin period: the loop counts as busy (its idle-time chores wait)."""
        return now < self._until

    def idle_turn(self):
        """A poll inside the spin period found nothing: give the CPU to any other runnable thread
        (a sensor on the same machine, another process) before polling again; when none
        waits this returns at once, so an otherwise idle CPU keeps polling."""
        os.sched_yield()

    def timeout_ms(self, now: float, pending: bool) -> int:
        """The next poll's timeout: 0 while work waits or inside the spin period, else IDLE_MS."""
        return 0 if pending or self.active(now) else IDLE_MS
