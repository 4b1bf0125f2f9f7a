"""``ClusterClient``: the ``SensorClient`` API over NATS, with the de-duplication the cluster's
at-least-once answers need.

A step is published to ``st.in.<stream>`` with the JetStream message id ``<stream>:<seq>``
(the server drops a resend within its duplicate window); its answer comes back on
``st.out.<stream>`` (or ``st.err.<stream>``). After a failover the new owner replays from its
checkpoint and answers some steps again, with the same (stream, seq) and a higher epoch: the
client hands each (stream, seq) to the caller once and counts the repeats in ``duplicates``.
The NATS connection runs on an asyncio loop in a background thread; the API is synchronous.

The numbering per stream and the resync after a restart (of a worker, of the sensor, or both)
are ``SensorClient``'s (streamtrace/transport/numbering.py): the same ``step`` / ``send`` / ``recv`` and the
same errors. Message ids carry a token of this client (``<stream>:<seq>:<token>``), so a sensor
restarted at seq 0 is not mistaken by the server for a resend of its old self: its first step
reaches a worker, is refused as ``repeat`` naming the expected number, and is resynced.
"""
from __future__ import annotations

import asyncio
import os
import queue
import threading
import time

from .. import wire
from ..transport.numbering import NumberedClient, Sample, checked
from ..transport.replies import Prediction, decode_reply
from . import jetstream as L

__all__ = ["ClusterClient"]


class ClusterClient(NumberedClient):
    """A sensor's connection to a streamtrace cluster (workers on NATS JetStream): the API of
    :class:`~streamtrace.transport.SensorClient`. ``step(x)`` sends one step and waits for its
    :class:`~streamtrace.transport.Prediction`; ``send`` / ``recv`` pipeline several; each stream
    is numbered by the client and resynced after a worker or sensor restart without raising and
    without losing the step (``resyncs``, one log line each); any other refusal raises
    :class:`~streamtrace.transport.EngineError` (``recv(raise_errors=False)`` returns it).
    Each (stream, seq) reaches the caller once, however often a failover answers it
    (``duplicates`` counts the rest).

    Parameters
    ----------
    url : the NATS server, ``nats://host:4222``.
    stream : the default stream id (a NATS subject token too: no ``.``, ``*``, ``>``, spaces).
    start_seq : the default stream's first sequence number (a wrong guess is resynced).
    timeout_s : how long one answer is waited for (then TimeoutError).
    creds : NATS credentials (:class:`streamtrace.cluster.Credentials`), if the server needs them.
    dedup_window : answers remembered per stream to drop a failover's repeats.
    on_answer : called in the NATS thread with each answer not waited for by ``step``, instead
        of queueing it for ``recv`` (bridges, which send with ``send_raw`` / ``post``; ``send`` and
        ``recv`` need the queue).

    Example (with ``nats-server -js`` and a ``streamtrace worker`` running a model of one input)::

        import numpy as np
        from streamtrace.cluster import ClusterClient
        with ClusterClient("nats://127.0.0.1:4222", stream="imu-7") as sensor:
            reply = sensor.step(np.array([0.5], np.float32))     # reply.pred, reply["loss"]
            sensor.send([0.6], stream="imu-8")
            other = sensor.recv()
    """

    def __init__(self, url: str, *, stream: str = "sensor-0", start_seq: int = 0, timeout_s: float = 10.0,
                 creds: L.Credentials | None = None, dedup_window: int = 100_000, on_answer=None):
        self.url, self.timeout_s = url, timeout_s
        self._numbered(L.check_stream_id(stream), start_seq)
        self.token = os.urandom(4).hex()       # in message ids: a restarted client is not a resend
        self.answered: dict[str, set] = {}     # per stream: (code or "prediction", seq) handed to the caller
        self.dedup_window = dedup_window       # a replay never reaches further back than this many steps
        self.duplicates = 0
        self.post_failures = 0                 # posted publications the NATS client refused after all
        self.trace: list | None = None         # set to a list: every answer's (time, headers) before de-duplication
        self.inbox: queue.Queue = queue.Queue()
        self.on_answer = on_answer             # called in the NATS thread with each answer instead of queueing it
        self._waiting: dict[tuple, asyncio.Future] = {}   # (stream, seq) -> step() waiting in the NATS thread
        self._subs: dict[str, object] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="streamtrace-nats")
        self._thread.start()
        try:
            self.nc = self._call(L.connect(url, creds, name="streamtrace-client"), timeout_s)
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro, timeout=None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout or self.timeout_s)

    # ---- sending ------------------------------------------------------------------------
    @property
    def seqs(self) -> dict:
        """Each stream's next sequence number."""
        return self.numbering.next

    @property
    def _wait_s(self) -> float:
        return self.timeout_s

    def _stream_id(self, name: str) -> str:
        return L.check_stream_id(name)

    def _transmit(self, stream: str, seq: int, raw: bytes):
        self.send_raw(raw, stream=stream, msg_id=self._msg_id(stream, seq))

    def _msg_id(self, stream: str, seq: int) -> str:
        return f"{stream}:{seq}:{self.token}"

    def send_raw(self, raw: bytes, *, stream: str, msg_id: str | None = None):
        """Publish bytes as they are on ``stream``'s subject (bad messages included: the worker refuses them)."""
        self._call(self._publish(L.check_stream_id(stream), raw, msg_id))

    def post(self, raw: bytes, *, stream: str):
        """Publish without waiting for the NATS thread (a bridge's pipelined samples, no message
        id): the publication is queued on it in call order. A stream's first message, and any while
        the connection is down, go through ``send_raw`` instead: the first subscribes to the
        stream's answers before it is sent, and a publication the client cannot buffer then raises."""
        if stream not in self._subs or not self.nc.is_connected:
            return self.send_raw(raw, stream=stream)
        self._loop.call_soon_threadsafe(self._post, L.in_subject(stream), raw)

    def _post(self, subject: str, raw: bytes):
        self._loop.create_task(self.nc.publish(subject, raw)).add_done_callback(self._posted)

    def _posted(self, task):
        if not task.cancelled() and task.exception() is not None:
            self.post_failures += 1

    async def _publish(self, stream, raw, msg_id):
        if stream not in self._subs:      # listen before the first step, or its answer could pass unseen
            self._subs[stream] = [await self.nc.subscribe(L.out_subject(stream), cb=self._on_answer),
                                  await self.nc.subscribe(L.err_subject(stream), cb=self._on_answer)]
            await self.nc.flush()
        await self.nc.publish(L.in_subject(stream), raw, headers={"Nats-Msg-Id": msg_id} if msg_id else None)

    async def _request(self, name: str, seq: int, raw: bytes):
        """Publish and wait for the answer both here, in the NATS thread: one hand-over between
        threads each way (as nats' own request), where a send and a wait on the inbox took three."""
        fut = self._loop.create_future()
        self._waiting[(name, seq)] = fut
        try:
            await self._publish(name, raw, self._msg_id(name, seq))
            return await asyncio.wait_for(fut, self.timeout_s)
        except asyncio.TimeoutError:
            return None
        finally:
            self._waiting.pop((name, seq), None)

    async def _on_answer(self, msg):
        if self.trace is not None:
            self.trace.append((time.monotonic(), msg.subject, dict(msg.headers or {})))
        try:
            answer = decode_reply(msg.data)
        except wire.WireError:
            return
        stream = answer.get("stream")
        if stream is not None:           # a replay answers (stream, seq) again: once to the caller
            key = (answer.get("code", "prediction"), answer.get("seq"))
            seen = self.answered.setdefault(stream, set())
            if key in seen:
                self.duplicates += 1
                return
            seen.add(key)
            if len(seen) > 2 * self.dedup_window:      # bounded: forget answers far behind the newest
                floor = max(s for _, s in seen if isinstance(s, int)) - self.dedup_window
                self.answered[stream] = {k for k in seen if not isinstance(k[1], int) or k[1] >= floor}
        answer["epoch"] = int(msg.headers.get("St-Epoch", 0)) if msg.headers else 0
        answer["worker"] = msg.headers.get("St-Worker") if msg.headers else None
        waiting = self._waiting.pop((stream, answer.get("seq")), None)
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)
        elif self.on_answer is not None:
            self.on_answer(answer)
        else:
            self.inbox.put(answer)

    # ---- receiving ----------------------------------------------------------------------
    def _receive(self, timeout_s: float) -> dict:
        try:
            return self.inbox.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no answer from the cluster at {self.url} within {timeout_s:g} s") from None

    def step(self, x, y=None, *, stream: str | None = None, mode: str | None = None) -> Prediction:
        """Publish one step and wait for its answer, as ``SensorClient.step``: a repeat/gap
        refusal is resynced and the step sent again; any other error raises EngineError (its
        sequence number is then not used up). With nothing else of the stream in flight the
        answer is awaited in the NATS thread itself (one hand-over between threads each way)."""
        name = L.check_stream_id(stream or self.stream)
        if self.numbering.flying[name]:           # behind steps sent with send(): in their order
            return super().step(x, y, stream=name, mode=mode)
        seq = self.numbering.take(name)
        sample = Sample(wire.data_message(name, seq, x, y, ts=time.time(), mode=mode))
        self.numbering.sent(name, seq, sample)
        while True:
            a = self._call(self._request(name, seq, sample.raw), self.timeout_s + 5.0)
            if a is None:
                self.numbering.forget(name, sample)
                raise TimeoutError(f"no answer for stream {name!r} seq {seq} within {self.timeout_s} s")
            out = self.numbering.settle(a)
            if out.deliver:
                return checked(a, True)
            if not out.resend:          # a refusal already resynced: this step's answer is still to come
                return checked(self._await(sample, name), True)
            (_, seq, _), = out.resend   # nothing else of the stream was in flight: only this step
            sample.renumber(seq)
            self.numbering.sent(name, seq, sample)

    # ---- end ----------------------------------------------------------------------------
    def close(self):
        if self._loop.is_running():
            try:
                self._call(self.nc.close(), 5)
            except Exception:  # noqa: BLE001 - closing a connection that is already gone
                pass
            self._stop_loop()

    def _stop_loop(self):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

