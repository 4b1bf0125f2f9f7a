"""``ClusterClient``: the ``SensorClient`` API over NATS, with the de-duplication the cluster's
at-least-once answers need.

A step is published to ``st.in.<stream>`` with the JetStream message id ``<stream>:<seq>``
(the server drops a resend within its duplicate window); its answer comes back on
``st.out.<stream>`` (or ``st.err.<stream>``). After a failover the new owner replays from its
checkpoint and answers some steps again, with the same (stream, seq) and a higher epoch: the
client hands each (stream, seq) to the caller once and counts the repeats in ``duplicates``.
The NATS connection runs on an asyncio loop in a background thread; the API is synchronous.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time

from .. import wire
from . import log as L

__all__ = ["ClusterClient"]


class ClusterClient:
    def __init__(self, url: str, *, stream: str = "sensor-0", start_seq: int = 0, timeout_s: float = 10.0,
                 creds: L.Credentials | None = None, dedup_window: int = 100_000, on_answer=None):
        self.url, self.stream, self.timeout_s = url, L.check_stream_id(stream), timeout_s
        self.seqs: dict[str, int] = {stream: start_seq}
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
    def send(self, x, y=None, *, stream: str | None = None, seq: int | None = None, mode: str | None = None) -> int:
        """Publish one step; returns its sequence number (kept per stream)."""
        name = stream or self.stream
        n = self.seqs.get(name, 0) if seq is None else seq
        self.send_raw(wire.data_message(name, n, x, y, ts=time.time(), mode=mode), stream=name, msg_id=f"{name}:{n}")
        if seq is None:
            self.seqs[name] = n + 1
        return n

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
            await self._publish(name, raw, f"{name}:{seq}")
            return await asyncio.wait_for(fut, self.timeout_s)
        except asyncio.TimeoutError:
            return None
        finally:
            self._waiting.pop((name, seq), None)

    async def _on_answer(self, msg):
        if self.trace is not None:
            self.trace.append((time.monotonic(), msg.subject, dict(msg.headers or {})))
        try:
            answer = _decode(msg.data)
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
    def recv(self, timeout_s: float | None = None) -> dict:
        """The next answer (a prediction or an error), each (stream, seq) once."""
        try:
            return self.inbox.get(timeout=self.timeout_s if timeout_s is None else timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no answer from the cluster at {self.url} within "
                               f"{self.timeout_s if timeout_s is None else timeout_s} s") from None

    def step(self, x, y=None, *, stream: str | None = None, mode: str | None = None) -> dict:
        """Publish one step and wait for its answer; an error raises EngineError (the step's
        sequence number is then not used up, as with SensorClient)."""
        from ..adapters.client import EngineError
        name = L.check_stream_id(stream or self.stream)
        seq = self.seqs.get(name, 0)
        raw = wire.data_message(name, seq, x, y, ts=time.time(), mode=mode)
        self.seqs[name] = seq + 1
        a = self._call(self._request(name, seq, raw), self.timeout_s + 5.0)
        if a is None:
            raise TimeoutError(f"no answer for stream {name!r} seq {seq} within {self.timeout_s} s")
        if a["type"] == "error":
            self.seqs[name] = a.get("expected", seq)
            raise EngineError(a["code"], a["message"], a)
        return a

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


def _decode(raw: bytes) -> dict:
    from ..adapters.client import decode_reply
    return decode_reply(raw)
