"""The runner's stream table: which slot serves which stream, and where each stream's sequence
numbers stand (the same rules as ``serve``: a repeated seq is refused as ``repeat``, one that
skips ahead as ``gap``, a stream beyond the free slots as ``no_slot``; after a restart from a
checkpoint a stream's first message may skip ahead, counted as lost on resync).

>>> table = StreamTable(slots=1)
>>> table.admit("a", 0).slot, table.admit("a", 1).slot
(0, 0)
>>> table.admit("a", 1)
('repeat', "stream 'a': seq 1 was already received (expected 2)", 2)
>>> table.admit("b", 0)[0]
'no_slot'
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Stream", "StreamTable"]


@dataclass
class Stream:
    """One admitted stream: its ``slot`` and the ``next_seq`` it must send (None: any)."""
    slot: int
    next_seq: int | None
    resync: bool = False          # restored from a checkpoint: its next message may skip ahead


class StreamTable:
    """Streams admitted to ``slots`` slots, first come first served, never evicted.

    Parameters
    ----------
    slots : int
        How many streams the exported learner steps (``streamtrace export --slots``).
    """

    def __init__(self, slots: int):
        self.slots = slots
        self.streams: dict[str, Stream] = {}
        self.lost_on_resync = 0

    @property
    def free(self) -> list[int]:
        """The slots no stream holds, lowest first."""
        used = {s.slot for s in self.streams.values()}
        return [i for i in range(self.slots) if i not in used]

    def expected(self, name: str) -> int | None:
        st = self.streams.get(name)
        return None if st is None else st.next_seq

    def admit(self, name: str, seq: int):
        """The ``Stream`` that steps ``(name, seq)`` now, its position advanced; or a refusal
        ``(code, message, expected)`` that changes nothing."""
        st = self.streams.get(name)
        if st is not None and st.next_seq is not None and seq != st.next_seq:
            if seq < st.next_seq:
                return ("repeat", f"stream '{name}': seq {seq} was already received (expected {st.next_seq})",
                        st.next_seq)
            if not st.resync:
                return ("gap", f"stream '{name}': seq {seq} skips ahead (expected {st.next_seq}); resend from "
                        f"{st.next_seq}", st.next_seq)
            self.lost_on_resync += seq - st.next_seq
        if st is None:
            free = self.free
            if not free:
                return ("no_slot", f"all {self.slots} slots are busy; stream '{name}' was not admitted (export "
                        "with more --slots)", None)
            st = self.streams[name] = Stream(free[0], None)
        st.next_seq, st.resync = seq + 1, False
        return st

    def to_extra(self) -> dict:
        """Each stream's slot and next seq, as ``serve`` records them in a checkpoint."""
        return {n: {"slot": s.slot, "next_seq": s.next_seq} for n, s in self.streams.items()}

    def restore(self, saved: dict):
        """The streams of a checkpoint's ``extra["streams"]`` (``serve``'s or the runner's), each
        allowed to skip ahead once (its sensor may have sent on while the server was down)."""
        self.streams = {n: Stream(int(s["slot"]), s.get("next_seq"), resync=True) for n, s in saved.items()
                        if 0 <= int(s["slot"]) < self.slots}
