"""The runner's streams: which slot serves which stream, admission (repeat, gap, no_slot, in
``serve``'s words), idle streams freed and parked, and where each stream stands in a
checkpoint. A parked stream keeps its slot's buffers (the programs never write their inputs:
no copy) for ``park_s`` seconds, at most ``max_parked`` of them, and resumes where it left off
if it comes back in time (``serve``'s engine.park_s / engine.max_parked)."""
from __future__ import annotations

from dataclasses import dataclass

from . import labels
from .parking import ParkingLot, expected_seq

__all__ = ["Stream", "StreamTable", "Refused"]


@dataclass
class Stream:
    slot: int
    next_seq: int | None = None
    last_seen: float = 0.0
    resync: bool = False               # restored from a checkpoint: may jump forward once
    recent: object = None              # its last data seqs (learning.label_delay; labels.window)


class Refused(Exception):
    """A data message not admitted: ``code``, the message, and ``expected`` (or None)."""

    def __init__(self, code: str, message: str, expected=None):
        super().__init__(message)
        self.code, self.extra = code, ({} if expected is None else {"expected": expected})


class StreamTable:
    """The streams of a ``bank.RunnerBank`` of ``n`` slots; counts into ``metrics``
    (``counters.EngineCounters``: parked, unparked, park_dropped, lost_on_resync).

    >>> from types import SimpleNamespace as NS
    >>> from streamtrace_runner.counters import EngineCounters
    >>> bank = NS(n=1, slots=["fresh"], reset=lambda slot: None)
    >>> table = StreamTable(bank, EngineCounters(), idle_timeout_s=1.0, park_s=60.0, max_parked=4, label_delay=0)
    >>> table.admit("a", 0, now=0.0).slot, table.admit("b", 0, now=0.5).__class__.__name__
    (0, 'NoneType')
    >>> table.evict_idle(now=2.0); len(table.parking), table.admit("a", 1, now=3.0).slot
    (1, 0)
    """

    def __init__(self, bank, metrics, *, idle_timeout_s, park_s, max_parked, label_delay, on_gap="reject"):
        self.bank, self.metrics, self.idle_timeout_s, self.on_gap = bank, metrics, idle_timeout_s, on_gap
        self.label_delay = label_delay
        self.streams: dict[str, Stream] = {}
        self.free = list(range(bank.n - 1, -1, -1))
        self.parking = ParkingLot(park_s, max_parked)

    def expected(self, name: str, now: float):
        """The seq stream ``name`` expects next (None: unknown, or any)."""
        return expected_seq(self.streams, self.parking, name, now)

    def check(self, name: str, seq: int, now: float):
        """Refused (repeat, gap) for a seq the stream cannot take; nothing changes."""
        st = self.streams.get(name)
        expected = self.expected(name, now)
        if expected is None or seq == expected:
            return
        if seq < expected:
            raise Refused("repeat", f"stream '{name}': seq {seq} was already received (expected {expected})", expected)
        if not (st is not None and st.resync) and self.on_gap == "reject":
            raise Refused("gap", f"stream '{name}': seq {seq} skips ahead (expected {expected}); resend from "
                          f"{expected}", expected)

    def admit(self, name: str, seq: int, now: float):
        """The stream of an admitted data message (a slot taken, or its parked state back), or
        None: no slot to be had. Call ``check`` first."""
        st = self.streams.get(name)
        expected = self.expected(name, now)
        if st is None:
            parked = self.parking.get(name, now) if self.parking.enabled else None
            slot = self.take_slot(now, fresh=parked is None)
            if slot is None:
                return None               # not admitted (a parked stream stays parked)
            if parked is not None:
                self.bank.slots[slot] = parked.state
                self.parking.take(name)
                self.metrics.count("unparked")
            st = self.streams[name] = Stream(slot, expected, recent=labels.window(
                self.label_delay, parked.recent if parked is not None and parked.recent else ()))
        if expected is not None and seq > expected:
            self.metrics.count("lost_on_resync", seq - expected)
        st.next_seq, st.resync, st.last_seen = seq + 1, False, now
        return st

    def take_slot(self, now: float, fresh: bool = True):
        """A free slot (evicting idle streams if none; None if there is none), reset if ``fresh``
        (the bank's reset costs nothing: the initial state is given when the slot is stepped)."""
        if not self.free:
            self.evict_idle(now)
        slot = self.free.pop() if self.free else None
        if slot is not None and fresh:
            self.bank.reset(slot)
        return slot

    def evict_idle(self, now: float):
        """Free the slots of streams idle for longer than ``idle_timeout_s``; with parking on,
        their state is parked, to be restored if they return in time."""
        lot = self.parking
        if lot.enabled:
            lot.expire(now)
        for name, st in list(self.streams.items()):
            if now - st.last_seen > self.idle_timeout_s:
                if lot.enabled:
                    self.metrics.count("park_dropped", lot.park(name, now, st.next_seq, self.bank.slots[st.slot],
                                                                st.recent))
                    self.metrics.count("parked")
                del self.streams[name]
                self.metrics.forget(name)
                self.free.append(st.slot)

    def positions(self) -> dict:
        """Each stream's slot and next seq (and recent seqs): a checkpoint's "streams", as serve's."""
        return {n: {"slot": s.slot, "next_seq": s.next_seq, **({} if s.recent is None else {"recent": list(s.recent)})}
                for n, s in self.streams.items()}

    def restore(self, saved: dict, now: float):
        """The streams of a checkpoint (``positions``); every slot counts as used."""
        self.streams = {name: Stream(int(s["slot"]), s["next_seq"], now, resync=True,
                                     recent=labels.window(self.label_delay, s.get("recent") or ()))
                        for name, s in saved.items()}
        used = {st.slot for st in self.streams.values()}
        self.free = [i for i in range(self.bank.n - 1, -1, -1) if i not in used]
