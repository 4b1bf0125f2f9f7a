"""A bridge's connection to the engine: many streams, pipelined, one DEALER socket.

A bus bridge (LSL, MQTT) receives samples of many streams and must not wait for one answer
before forwarding the next sample, so it cannot use ``SensorClient.step``. ``EngineLink``
numbers each stream's steps itself, sends without waiting, and hands back the engine's answers
as they arrive (``poll``). Its socket can join a ``zmq.Poller`` with the bus's own sockets.

Sequence numbers: after a bridge restart the engine still holds each stream's state and
expects its next number; the first sample is then refused as ``repeat`` (or ``gap``) with the
number the engine expects, the link adopts it, and the stream goes on from there. The same
happens after a sample the engine refused unread (a wrong shape): its number was not used.
Samples refused that way are counted (``resynced``), not resent: a resend would reorder the
stream.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import zmq

from streamtrace import wire

from streamtrace.transport.client import _curve, decode_reply

__all__ = ["EngineLink", "Answer"]

@dataclass
class Answer:
    """One answer from the engine: a prediction (``pred`` set) or a refusal (``error`` set)."""
    stream: str
    seq: int
    pred: np.ndarray | None
    ts: float | None            # the timestamp sent with the sample, echoed by the engine
    rtt_s: float | None         # send -> answer, measured here
    error: str | None = None    # the engine's error code
    message: str = ""
    reply: dict | None = None


class EngineLink:
    """The numbering and the answers' bookkeeping; the transport (a ZeroMQ DEALER here) is in
    ``_transmit``, ``_wait`` and ``_drain``, which :class:`~streamtrace.adapters.cluster_link.ClusterLink`
    replaces with NATS. ``sock`` is what a ``zmq.Poller`` waits on for answers."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:5555", *, ctx: zmq.Context | None = None,
                 server_public_key: bytes | None = None, client_keys: str | None = None,
                 max_in_flight: int = 4096):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        _curve(self.sock, server_public_key, client_keys)
        self.sock.connect(endpoint)
        self._numbering(endpoint, max_in_flight)

    def _numbering(self, endpoint: str, max_in_flight: int):
        self.endpoint = endpoint
        self.max_in_flight = max_in_flight
        self.next_seq: dict[str, int] = {}
        self.epoch: dict[str, int] = {}      # bumped at each resync: older refusals are stale
        self.sent_at: dict[tuple[str, int], tuple[float, int]] = {}
        self.counts: Counter = Counter()     # sent, answered, refused:<code>, resynced, dropped_in_flight

    @property
    def in_flight(self) -> int:
        return len(self.sent_at)

    def send(self, stream: str, x, *, ts: float | None = None, y=None, mode: str | None = None) -> int | None:
        """Forward one sample of ``stream`` without waiting; returns its sequence number, or
        None when the engine has stopped taking messages (its queue here is full; counted as
        ``not_sent``). Raises ``ValueError`` for a sample the engine would refuse unread (not
        finite), so the caller can count it as a bad payload. No number is used up by either."""
        x = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(x)) or (y is not None and not np.all(np.isfinite(np.asarray(y, np.float64)))):
            raise ValueError("sample contains NaN or Inf")
        if len(self.sent_at) >= self.max_in_flight:
            # the engine stopped answering some: forget the oldest rather than grow without bound
            self.sent_at.pop(next(iter(self.sent_at)))
            self.counts["dropped_in_flight"] += 1
        seq = self.next_seq.get(stream, 0)
        if not self._transmit(stream, wire.data_message(stream, seq, x, y, ts=ts, mode=mode)):
            self.counts["not_sent"] += 1
            return None
        self.next_seq[stream] = seq + 1
        self.sent_at[(stream, seq)] = (time.perf_counter(), self.epoch.get(stream, 0))
        self.counts["sent"] += 1
        return seq

    def _transmit(self, stream: str, raw: bytes) -> bool:
        try:
            # never block a bridge: with the engine gone, ZeroMQ's queue fills (its high-water mark)
            self.sock.send_multipart([b"", raw], zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def _wait(self, timeout_s: float) -> bool:
        return bool(self.sock.poll(int(timeout_s * 1000)))

    def _drain(self):
        """The decoded answers waiting now (None for one that could not be decoded)."""
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                yield decode_reply(frames[-1])
            except Exception:           # not ours to crash on: counted by _answer
                yield None

    def poll(self, timeout_s: float = 0.0) -> list[Answer]:
        """Every answer that has arrived, waiting up to ``timeout_s`` for the first one."""
        if not self._wait(timeout_s):
            return []
        return [a for a in map(self._answer, self._drain()) if a is not None]

    def _answer(self, msg: dict | None) -> Answer | None:
        if msg is None:
            self.counts["bad_reply"] += 1
            return None
        stream, seq = msg.get("stream"), msg.get("seq")
        sent = self.sent_at.pop((stream, seq), None) if isinstance(stream, str) else None
        rtt = None if sent is None else time.perf_counter() - sent[0]
        if msg.get("type") == "prediction":
            self.counts["answered"] += 1
            return Answer(stream, seq, msg["pred"], msg.get("ts"), rtt, reply=msg)
        if msg.get("type") != "error":
            self.counts["other_reply"] += 1
            return None
        code = msg.get("code", "?")
        self.counts[f"refused:{code}"] += 1
        expected = msg.get("expected")
        if isinstance(expected, int) and sent is not None and sent[1] == self.epoch.get(stream, 0) \
                and expected != self.next_seq.get(stream):
            # the engine numbers this stream differently (it knew it before us, or refused a sample
            # unread without using its number): continue from its number; refusals of samples sent
            # before this point are then stale and ignored
            self.next_seq[stream] = expected
            self.epoch[stream] = sent[1] + 1
            self.counts["resynced"] += 1
        return Answer(stream if isinstance(stream, str) else "", seq if isinstance(seq, int) else -1, None,
                      None, rtt, error=code, message=msg.get("message", ""), reply=msg)

    def close(self):
        self.sock.close(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
