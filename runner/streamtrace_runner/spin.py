"""Busy polling: between messages that come close together a server's loop polls its sockets
without sleeping (``serve``'s engine.busy_poll_us, the runner's ``--busy-poll-us``).

A blocked poll costs a wake-up per message (the kernel's scheduler, an idle vCPU woken, then
cold caches for the Python that reads, steps and replies); polling on after a message cut a
one-sensor round trip's median nearly in half (one GRU-64 sensor over ipc). It pays only if
the next message comes while the loop still polls: a sensor sending a little slower than the
window met an engine that had gone to sleep and paid the wake-up anyway. So the window is
measured against the sender: after traffic that came at most ``spin_us`` after the traffic
before it, the loop polls for ``spin_us`` and a steady sender never finds it asleep (measured
in docs/benchmarks.md, by bench/poll_window.py); after
a longer gap (or the first message after idle) it polls for ``SHORT_US`` only, as before.

The cost is CPU time while traffic flows: a sender at least every ``spin_us`` keeps one CPU
busy, a slower one ~``SHORT_US`` per message, an idle engine none; each empty poll yields
the CPU first, so other runnable work (the sensor, another process) still gets it. An engine
that may run on one CPU only never spins: it would take that CPU from the sender and from XLA.
"""
from __future__ import annotations

import os

__all__ = ["BusyPoll"]

IDLE_MS = 50     # a blocked poll's timeout: how often an idle loop does its timed chores
SHORT_US = 1000  # the poll after traffic that came after a longer gap (at most the window)


class BusyPoll:
    """Poll without sleeping between messages at most ``spin_us`` apart (engine.busy_poll_us;
    0: off); ``cpus``: the CPUs this process may run on (default: its affinity).

    >>> spin = BusyPoll(5000, cpus=2)
    >>> spin.busy(0.0); spin.timeout_ms(0.0005, pending=False), spin.timeout_ms(0.01, pending=False)
    (0, 50)
    >>> BusyPoll(5000, cpus=1).timeout_ms(0.0, pending=False)      # one CPU: never spins
    50
    """

    def __init__(self, spin_us: int, cpus: int | None = None):
        cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
        self.spin_s = spin_us / 1e6 if cpus > 1 else 0.0
        self.short_s = min(self.spin_s, SHORT_US / 1e6)
        self._until = float("-inf")
        self._last = None       # when traffic was last handled

    def busy(self, now: float):
        """Traffic was handled at ``now``: poll on for the spin period if the traffic before
        it was at most that long ago (the next is likely to come inside it), else for
        ``SHORT_US``."""
        last, self._last = self._last, now
        close = last is not None and now - last <= self.spin_s
        self._until = now + (self.spin_s if close else self.short_s)

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
