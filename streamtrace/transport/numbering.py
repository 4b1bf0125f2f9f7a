"""Each stream's sequence numbers on the client side, and the resync after a restart.

Shared by :class:`~streamtrace.transport.SensorClient` (ZeroMQ) and
:class:`~streamtrace.cluster.ClusterClient` (NATS); only the transport differs.

The engine expects each stream's messages numbered 0, 1, 2, ... and refuses a number it did
not expect as ``repeat`` (already received) or ``gap`` (skips ahead), naming the number it
``expected``. That happens after a restart: a sensor process restarted with a fresh client
starts again at 0 while the engine remembers the stream, or a sample before was refused unread
(its number unused) while later ones were already on their way. The client then takes the
engine's number (a *resync*: counted in ``resyncs``, one log line each on the
``streamtrace.client`` logger) and sends the refused sample again under it, followed by every
later sample of the stream that was in flight behind it, in their order: nothing is lost,
nothing is reordered, and the caller sees no error. The refusals still to come for those
samples are expected and dropped.

So that a restarted client never has several samples of a stream in flight under numbers the
engine will refuse (some of which it might accept), the first sample of each stream, and the
first after a resync, is answered before the next of that stream is sent (``unconfirmed``).
One sender per stream id is assumed: two processes numbering the same stream fight, and a
sample resent ``MAX_RESYNCS`` times is refused for good (EngineError).
"""
from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass

import msgpack

from .. import wire

from .replies import EngineError, Prediction

log = logging.getLogger("streamtrace.client")

__all__ = ["Numbering", "NumberedClient", "Sample", "Outcome", "checked", "RESYNC_CODES", "MAX_RESYNCS"]

RESYNC_CODES = ("repeat", "gap")
MAX_RESYNCS = 3          # per sample
LABEL_CODES = ("unknown_label", "label_too_late", "already_labelled")


@dataclass(eq=False, slots=True)
class Sample:
    """One data message a client numbered itself (``raw``, encoded), kept until it is answered
    (to be sent again under another number after a resync)."""
    raw: bytes
    resyncs: int = 0

    def renumber(self, seq: int):
        msg = msgpack.unpackb(self.raw, raw=False)
        msg["seq"] = int(seq)
        self.raw = msgpack.packb(msg, use_bin_type=True)


@dataclass(slots=True)
class Outcome:
    """What a client does with one answer: hand it to the caller (``deliver``; ``sample`` is the
    step it answers, when the client numbered it) and send ``resend`` [(stream, seq, Sample)], in order."""
    deliver: bool
    sample: Sample | None = None
    resend: tuple = ()


class Numbering:
    """The next sequence number of every stream a client sends on, the samples in flight and the
    resync policy (see the module's docstring).

    Parameters
    ----------
    stream : the client's default stream (its numbering starts at ``start_seq``; others at 0).
    start_seq : the default stream's first number.
    max_in_flight : samples kept for a resend at most; beyond it the oldest is forgotten
        (counted in ``counts["forgotten"]``: it could not be resent).

    Example::

        >>> n = Numbering("a")
        >>> n.take("a"), n.take("a"), n.take("b")
        (0, 1, 0)
    """

    def __init__(self, stream: str, start_seq: int = 0, max_in_flight: int = 4096):
        self.next: dict[str, int] = {stream: start_seq}
        self.in_flight: dict[tuple[str, int], Sample] = {}
        self.flying: Counter = Counter()         # stream -> samples of it in flight
        self.stale: Counter = Counter()          # (stream, seq) -> refusals to come for samples already resent
        self.confirmed: set[str] = set()         # streams whose numbering the engine has confirmed
        self.max_in_flight = max_in_flight
        self.resyncs = 0
        self.counts: Counter = Counter()         # stale (refusals dropped), forgotten

    def take(self, stream: str) -> int:
        """The stream's next number, used up."""
        n = self.next.get(stream, 0)
        self.next[stream] = n + 1
        return n

    def give_back(self, stream: str, seq: int):
        """A number taken for a message that was never sent."""
        if self.next.get(stream) == seq + 1:
            self.next[stream] = seq

    def sent(self, stream: str, seq: int, sample: Sample):
        """``sample`` went out as (stream, seq): keep it until it is answered."""
        if len(self.in_flight) >= self.max_in_flight:
            old = next(iter(self.in_flight))
            self.flying[old[0]] -= 1
            del self.in_flight[old]
            self.counts["forgotten"] += 1
        self.in_flight[(stream, seq)] = sample
        self.flying[stream] += 1

    def forget(self, stream: str, sample: Sample | None = None):
        """No answer came in time: stop waiting for ``sample`` (None: every sample of ``stream``)
        in flight; it is not resent (counted in ``counts["unanswered"]``), and its answer, should it
        still come, is handed over as one not numbered here."""
        for key in [k for k, s in self.in_flight.items() if k[0] == stream and (sample is None or s is sample)]:
            self._pop(key)
            self.counts["unanswered"] += 1

    def unconfirmed(self, stream: str) -> bool:
        """A sample of ``stream`` is in flight and the engine has not yet confirmed its numbering:
        wait for an answer before sending the next one of this stream."""
        return stream not in self.confirmed and self.flying[stream] > 0

    def _pop(self, key) -> Sample | None:
        sample = self.in_flight.pop(key, None)
        if sample is not None:
            self.flying[key[0]] -= 1
        return sample

    def settle(self, answer: dict) -> Outcome:
        """The engine's answer ``answer`` (a decoded reply): what to do with it."""
        stream, seq = answer.get("stream"), answer.get("seq")
        if not isinstance(stream, str) or not isinstance(seq, int):
            return Outcome(True)
        key, kind = (stream, seq), answer.get("type")
        if kind == "prediction":
            self.confirmed.add(stream)
            return Outcome(True, self._pop(key))
        if kind != "error" or answer.get("code") in LABEL_CODES:      # a label's answer: not a data step's
            return Outcome(True)
        if self.stale[key] > 0:                  # a sample already resent after a resync
            self.stale[key] -= 1
            if not self.stale[key]:
                del self.stale[key]
            self.counts["stale"] += 1
            return Outcome(False)
        sample = self.in_flight.get(key)
        expected = answer.get("expected")
        if sample is None:                       # numbered by the caller (seq=...) or send_raw: not ours
            return Outcome(True)
        code = answer.get("code")
        if code in RESYNC_CODES and isinstance(expected, int) and sample.resyncs < MAX_RESYNCS:
            keys = list(self.in_flight)
            behind = [k for k in keys[keys.index(key) + 1:] if k[0] == stream]   # sent after it: refused too
            return Outcome(False, sample, self._resync(key, behind, expected, code))
        self._pop(key)
        # refused for good: its number is unused (the engine's, when it says so and nothing is behind it)
        if not self.flying[stream]:
            self.next[stream] = expected if isinstance(expected, int) else seq
        self.confirmed.add(stream)
        return Outcome(True, sample)

    def _resync(self, key: tuple, behind: list, expected: int, code: str) -> tuple:
        stream, seq = key
        redo = [self._pop(key)] + [self._pop(k) for k in behind]
        self.stale.update(behind)
        self.next[stream] = expected
        self.confirmed.discard(stream)
        self.resyncs += 1
        log.warning("stream %r: the engine refused seq %d as %s and expects seq %d: resynced, %d sample(s) "
                    "sent again from seq %d (resync %d of this client)", stream, seq, code, expected, len(redo),
                    expected, self.resyncs)
        out = []
        for s in redo:
            s.resyncs += 1
            out.append((stream, self.take(stream), s))
        return tuple(out)


class NumberedClient:
    """``send`` / ``recv`` / ``step`` with per-stream numbering and resync, over a transport a
    subclass provides: ``_transmit(stream, seq, raw)`` sends one encoded message,
    ``_receive(timeout_s)`` returns the next decoded answer (TimeoutError when none comes),
    ``_wait_s`` is how long one answer is waited for, ``_stream_id(name)`` checks a stream id.
    A subclass calls ``_numbered(stream, start_seq)`` in its ``__init__``."""

    def _numbered(self, stream: str, start_seq: int):
        self.stream = stream
        self.numbering = Numbering(stream, start_seq)
        self._ready: deque = deque()        # answers received while waiting for another one

    @property
    def resyncs(self) -> int:
        """How many times this client took the engine's numbering of a stream (each logged)."""
        return self.numbering.resyncs

    def _stream_id(self, name: str) -> str:
        return name

    def send(self, x, y=None, *, stream: str | None = None, seq: int | None = None, mode: str | None = None) -> int:
        """Send one step of ``stream`` (default: the client's) without waiting for its answer;
        returns its sequence number, the stream's next unless ``seq`` is given (then the client
        neither numbers nor resends it). A send that times out raises TimeoutError and uses no number."""
        name = self._stream_id(stream or self.stream)
        if seq is not None:
            self._transmit(name, seq, wire.data_message(name, seq, x, y, ts=time.time(), mode=mode))
            return seq
        while self.numbering.unconfirmed(name):        # its first answer before its next step
            try:
                self._ready.append(self._next(self._wait_s)[0])
            except TimeoutError:
                self.numbering.forget(name)
                raise
        n = self.numbering.take(name)
        sample = Sample(wire.data_message(name, n, x, y, ts=time.time(), mode=mode))
        try:
            self._transmit(name, n, sample.raw)
        except BaseException:
            self.numbering.give_back(name, n)
            raise
        self.numbering.sent(name, n, sample)
        return n

    def recv(self, timeout_s: float | None = None, *, raise_errors: bool = True) -> dict:
        """The next answer, in the order they arrive: a :class:`Prediction`, or a refusal, raised
        as :class:`EngineError` (``raise_errors=False``: returned as the error map). Waits up to
        ``timeout_s`` (default: the client's timeout), then raises TimeoutError."""
        msg = self._ready.popleft() if self._ready else self._next(self._wait_s if timeout_s is None else timeout_s)[0]
        return checked(msg, raise_errors)

    def step(self, x, y=None, *, stream: str | None = None, mode: str | None = None) -> Prediction:
        """Send one step and wait for its prediction. ``repeat`` / ``gap`` refusals after a
        restart are resynced and the step sent again (not raised); any other refusal raises
        :class:`EngineError` and uses up no sequence number; no answer within the timeout raises
        TimeoutError (the step is not resent). Answers to earlier ``send`` calls that arrive
        meanwhile wait for ``recv``."""
        name = self._stream_id(stream or self.stream)
        sample = self.numbering.in_flight[(name, self.send(x, y, stream=name, mode=mode))]
        return checked(self._await(sample, name), True)

    def _await(self, sample: Sample, stream: str) -> dict:
        while True:
            try:
                msg, which = self._next(self._wait_s)
            except TimeoutError:
                self.numbering.forget(stream, sample)
                raise
            if which is sample:
                return msg
            self._ready.append(msg)

    def _next(self, timeout_s: float) -> tuple:
        """The next answer for the caller and the Sample it answers (None: not numbered here);
        refusals that resync are handled on the way."""
        while True:
            msg = self._receive(timeout_s)
            out = self.numbering.settle(msg)
            for name, n, s in out.resend:
                s.renumber(n)
                self._transmit(name, n, s.raw)
                self.numbering.sent(name, n, s)
            if out.deliver:
                return msg, out.sample


def checked(msg: dict, raise_errors: bool) -> dict:
    """``msg``, or EngineError raised from it if it is a refusal and ``raise_errors``."""
    if raise_errors and msg.get("type") == "error":
        raise EngineError.from_reply(msg)
    return msg
