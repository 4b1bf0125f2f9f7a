"""``ClusterLink``: a bridge's link to a cluster through NATS, in place of the ZeroMQ
``EngineLink`` (``streamtrace bridge lsl|mqtt --nats URL``).

The numbering, the resynchronisation after a refusal and the bookkeeping of answers are
``EngineLink``'s; only the transport differs: samples go out through a ``ClusterClient``
(whose NATS connection lives on a thread of its own, and which hands each (stream, seq) over
once however often a replay answers it), queued on its thread without waiting for it (as the
ZeroMQ link does not wait), answers come back through a deque, and a pipe is
written to when one arrives, so ``sock`` (its read end, a file descriptor) can join the
bridge's ``zmq.Poller`` or ``select`` like the engine's socket.

No JetStream message ids: a bridge never resends, and after a bridge restart its first sample
of a stream must reach the worker to be refused as ``repeat`` with the number it expects (the
link adopts it). With a message id inside the log's duplicate window that sample would be
dropped silently by the server and never answered.
"""
from __future__ import annotations

import collections
import os
import select

from streamtrace.cluster import jetstream as L
from streamtrace.cluster.client import ClusterClient

from .link import EngineLink

__all__ = ["ClusterLink"]


class ClusterLink(EngineLink):
    def __init__(self, url: str, *, creds: L.Credentials | None = None, max_in_flight: int = 4096,
                 timeout_s: float = 10.0):
        self._numbering(L.redact(url), max_in_flight)
        self._answers: collections.deque = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.sock = self._wake_r            # a file descriptor: what a zmq.Poller waits on
        try:
            self.client = ClusterClient(url, creds=creds, timeout_s=timeout_s, on_answer=self._arrived)
        except BaseException:
            self._close_pipe()
            raise

    def _arrived(self, answer: dict):       # in the client's NATS thread
        self._answers.append(answer)
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:             # the pipe is full: the bridge is already woken
            pass

    def _transmit(self, stream: str, raw: bytes) -> bool:
        L.check_stream_id(stream)           # ValueError before any number is used
        try:
            self.client.post(raw, stream=stream)      # no wait for the NATS thread: a sample is handed over, not awaited
        except Exception:  # noqa: BLE001 - connection closed, buffer full, timeout: not sent, counted
            return False
        return True

    def _wait(self, timeout_s: float) -> bool:
        if self._answers:
            return True
        ready, _, _ = select.select([self._wake_r], [], [], max(timeout_s, 0.0))
        return bool(ready) or bool(self._answers)

    def _drain(self):
        if self.client.post_failures:      # queued publications the NATS client refused (connection lost)
            self.counts["not_sent_queued"] = self.client.post_failures
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self._answers:     # an answer arriving after this wrote the pipe again: the next poll takes it
            yield self._answers.popleft()

    def close(self):
        self.client.close()
        self._close_pipe()

    def _close_pipe(self):
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
