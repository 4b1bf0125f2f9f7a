"""The stream table: which stream holds which slot, admission, queued steps, parking.

A data message's stream is admitted (``StreamTable.admit``): its sequence number checked
against the one its stream expects, a slot taken for a new stream (a free one, else one freed
by evicting idle streams; reset unless no stream has used it), a parked stream's state written
back into its slot. Its step is then queued on the stream (``queue``) until a tick runs it.
Streams idle for longer than ``engine.idle_timeout_s`` give their slot back
(``evict_idle``), their state parked (parking.py) to resume if they return in time. The
learner (an OnlineLearner with slots or a SlotBank) is touched only through its slot calls:
``reset_slot``, ``read_slot``, ``write_slot``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .parking import ParkingLot, expected_seq

__all__ = ["Stream", "StreamTable", "Refused"]


@dataclass
class Stream:
    slot: int
    next_seq: int | None = None       # None: the next message sets the base
    last_seen: float = 0.0
    resync: bool = False               # restored from a checkpoint: may jump forward once
    pending: deque = field(default_factory=deque)
    recent: deque | None = None        # learning.label_delay: the seqs of its last data messages


class Refused(Exception):
    """A message the table does not admit: its error ``code``, message and extra reply fields."""

    def __init__(self, code: str, message: str, **extra):
        super().__init__(message)
        self.code, self.extra = code, extra


class StreamTable:
    """The streams of one engine (``streams``: name -> Stream), its free slots and parked
    streams, and the number of queued steps over all streams (``pending``).

    Parameters
    ----------
    learner : OnlineLearner or SlotBank
        Whose slots the streams hold (``reset_slot`` / ``read_slot`` / ``write_slot``,
        ``label_delay``).
    ec : EngineConfig.engine
        slots, park_s, max_parked, max_pending, on_gap, idle_timeout_s.
    metrics : EngineCounters
        Where admissions and evictions are counted.
    clock : callable
        Now, in seconds (an idle stream's age).

    >>> from types import SimpleNamespace as NS
    >>> from streamtrace.engine.counters import EngineCounters
    >>> learner = NS(label_delay=0, reset_slot=lambda slot: None)
    >>> ec = NS(slots=2, park_s=0, max_parked=0, max_pending=4, on_gap="reject", idle_timeout_s=60.0)
    >>> table = StreamTable(learner, ec, EngineCounters(), clock=lambda: 0.0)
    >>> st = table.admit("a", 0, "a step", now=0.0)
    >>> st.slot, list(st.pending), table.free, table.pending
    (0, ['a step'], [1], 1)
    """

    def __init__(self, learner, ec, metrics, clock):
        self.learner, self.ec, self.metrics, self.clock = learner, ec, metrics, clock
        self.streams: dict[str, Stream] = {}
        self.free = list(range(ec.slots - 1, -1, -1))
        # slots no stream has used: their state is still the initial one (but for the learner's
        # count of calls, a statistic), so taking one needs no reset
        self.unused = set(self.free)
        self.parking = ParkingLot(ec.park_s, ec.max_parked)
        self.pending = 0                 # queued steps over all streams

    def expected(self, name: str, now: float):
        """The seq stream ``name`` expects next (None: unknown, or any)."""
        return expected_seq(self.streams, self.parking, name, now)

    def admit(self, name: str, seq: int, step, now: float) -> Stream:
        """The stream of a data message of ``name`` numbered ``seq``, its ``step`` (message,
        origin, t_recv) queued on it; ``Refused`` (nothing changed) for a repeat, a gap
        (``on_gap = "reject"``), a stream with ``max_pending`` steps queued, or no slot to be had."""
        ec = self.ec
        st = self.streams.get(name)
        parked = None
        if st is None and self.parking.enabled:
            parked = self.parking.get(name, now)     # it left idle and comes back: resume
        expected = st.next_seq if st is not None else parked.next_seq if parked is not None else None
        resync = st is not None and st.resync
        if expected is not None and seq != expected:
            if seq < expected:
                raise Refused("repeat", f"stream '{name}': seq {seq} was already received (expected {expected})",
                              expected=expected)
            if not resync and ec.on_gap == "reject":
                raise Refused("gap", f"stream '{name}': seq {seq} skips ahead (expected {expected}); resend "
                              f"from {expected}", expected=expected)
        if st is not None and len(st.pending) >= ec.max_pending:
            raise Refused("overloaded", f"stream '{name}' has {len(st.pending)} steps queued; slow down or "
                          "raise engine.max_pending", expected=seq)
        if st is None:
            slot = self.take_slot(fresh=parked is None)
            if slot is None:
                raise Refused("no_slot", f"all {ec.slots} slots are busy; stream '{name}' was not admitted "
                              "(raise engine.slots or wait for idle streams)")
            if parked is not None:
                self.learner.write_slot(slot, parked.state)
                self.parking.take(name)
                self.metrics.count("unparked")
            st = self.streams[name] = Stream(slot, expected, recent=self.recent(parked and parked.recent))
        if expected is not None and seq > expected:
            self.metrics.count("lost_on_resync", seq - expected)
        st.next_seq, st.resync, st.last_seen = seq + 1, False, now
        st.pending.append(step)
        self.pending += 1
        return st

    def recent(self, seqs=None):
        """A stream's window of recent data seqs (learning.label_delay), or None."""
        d = self.learner.label_delay
        return deque(seqs or (), maxlen=d) if d else None

    def take_slot(self, fresh: bool = True):
        """A free slot (evicting idle streams if none), reset if ``fresh`` and used; or None."""
        if not self.free:
            self.evict_idle()
        if not self.free:
            return None
        slot = self.free.pop()
        if fresh and slot not in self.unused:
            self.learner.reset_slot(slot)
        self.unused.discard(slot)
        return slot

    def evict_idle(self, now: float | None = None):
        """Free the slots of streams idle for longer than engine.idle_timeout_s; with
        engine.park_s their state is parked, to be restored if they return in time."""
        now = self.clock() if now is None else now
        lot = self.parking
        if lot.enabled:
            lot.expire(now)
        for name, st in list(self.streams.items()):
            if not st.pending and now - st.last_seen > self.ec.idle_timeout_s:
                if lot.enabled:
                    self.metrics.count("park_dropped", lot.park(name, now, st.next_seq, self.learner.read_slot(st.slot),
                                                                st.recent))
                    self.metrics.count("parked")
                del self.streams[name]
                self.metrics.forget(name)
                self.free.append(st.slot)

    def busy(self, micro_batch: int):
        """The streams with queued steps and how many steps of each a tick takes (up to
        ``micro_batch``)."""
        busy = [st for st in self.streams.values() if st.pending]
        return busy, min(max(len(st.pending) for st in busy), micro_batch)

    def positions(self) -> dict:
        """Each stream's slot and the first seq not yet stepped (a checkpoint's "streams")."""
        return {n: {"slot": s.slot, "next_seq": None if s.next_seq is None else s.next_seq - len(s.pending),
                    **({} if s.recent is None else {"recent": _stepped(s)})}
                for n, s in self.streams.items()}

    def restore(self, saved: dict, now: float):
        """The streams of a checkpoint (``positions``); every slot counts as used."""
        self.streams.clear()
        used = set()
        for name, s in saved.items():
            self.streams[name] = Stream(int(s["slot"]), s["next_seq"], now, resync=True,
                                        recent=self.recent(s.get("recent")))
            used.add(int(s["slot"]))
        self.free = [i for i in range(self.ec.slots - 1, -1, -1) if i not in used]
        self.unused = set()              # the loaded state is in every slot: a new stream resets its slot


def _stepped(st: Stream) -> list:
    """The seqs of the stream's data messages that have run (its ring holds their steps)."""
    seqs = list(st.recent)
    return seqs[:max(0, len(seqs) - len(st.pending))]
