"""Parked streams: the slot state of streams evicted for being idle, kept for a while so a
stream that returns resumes where it left off instead of starting fresh.

Each entry holds a slot's state (``serve``: what ``OnlineLearner.read_slot`` gives: hidden
state, traces, pending forecast input, transform statistics, readout, rolling metrics; with
per-slot weights also weights and optimizer state; the jax-free runner: the slot's buffers)
and the stream's expected seq. Entries expire after ``park_s`` seconds; at most ``max_parked`` are kept (the
oldest is dropped first), so memory stays bounded whatever streams come and go.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["Parked", "ParkingLot", "expected_seq"]


@dataclass
class Parked:
    since: float
    next_seq: int | None
    state: dict
    recent: list | None = None     # learning.label_delay: the seqs of its last data messages


class ParkingLot:
    def __init__(self, park_s: float, max_parked: int):
        self.park_s, self.max_parked = park_s, max_parked
        self._lot: OrderedDict[str, Parked] = OrderedDict()   # oldest first

    @property
    def enabled(self) -> bool:
        return self.park_s > 0

    def __len__(self):
        return len(self._lot)

    def park(self, name: str, now: float, next_seq: int | None, state: dict, recent=None) -> int:
        """Keep ``name``'s state; returns how many older entries were dropped to make room."""
        self._lot.pop(name, None)
        self._lot[name] = Parked(now, next_seq, state, None if recent is None else list(recent))
        dropped = 0
        while len(self._lot) > self.max_parked:
            self._lot.popitem(last=False)
            dropped += 1
        return dropped

    def get(self, name: str, now: float) -> Parked | None:
        """The parked entry of ``name`` if it has not expired (an expired one is dropped)."""
        p = self._lot.get(name)
        if p is not None and now - p.since > self.park_s:
            del self._lot[name]
            return None
        return p

    def take(self, name: str) -> Parked | None:
        return self._lot.pop(name, None)

    def expire(self, now: float) -> int:
        old = [n for n, p in self._lot.items() if now - p.since > self.park_s]
        for n in old:
            del self._lot[n]
        return len(old)


def expected_seq(streams: dict, lot: ParkingLot, name: str, now: float):
    """The seq stream ``name`` expects next: its own (``streams``: name -> an object with
    ``next_seq``), else its parked entry's; None: unknown, or any (``serve``'s and the runner's
    stream tables).

    >>> from types import SimpleNamespace as NS
    >>> lot = ParkingLot(park_s=60.0, max_parked=4); _ = lot.park("b", 0.0, 7, state={})
    >>> expected_seq({"a": NS(next_seq=3)}, lot, "a", 1.0), expected_seq({}, lot, "b", 1.0), expected_seq({}, lot, "c", 1.0)
    (3, 7, None)
    """
    known = streams.get(name)
    if known is not None:
        return known.next_seq
    parked = lot.get(name, now) if lot.enabled else None
    return None if parked is None else parked.next_seq
