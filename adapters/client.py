"""Sensor side: send x (and an optional target), get the prediction back.

``SensorClient`` uses a DEALER socket against the engine's ROUTER: ``step()`` sends one step
and waits for its answer (the lowest-latency path); ``send()`` / ``recv()`` pipeline several.
``PushClient`` is fire-and-forget against the engine's PULL socket (answers go to the PUB
socket only). Sequence numbers are kept per stream by the client.
"""
from __future__ import annotations

import time

import numpy as np
import zmq

from streamtrace import wire

__all__ = ["SensorClient", "PushClient", "EngineError", "Prediction"]


class EngineError(RuntimeError):
    def __init__(self, code: str, message: str, reply: dict):
        super().__init__(f"{code}: {message}")
        self.code, self.reply = code, reply


class Prediction(dict):
    """A decoded 'prediction' reply; ``.pred`` is the numpy prediction."""

    @property
    def pred(self) -> np.ndarray:
        return self["pred"]


def _curve(sock, server_public_key, client_keys):
    if server_public_key is None:
        return
    import zmq.auth
    if client_keys is None:
        public, secret = zmq.curve_keypair()
    else:
        public, secret = zmq.auth.load_certificate(client_keys)
    sock.curve_serverkey = server_public_key
    sock.curve_publickey, sock.curve_secretkey = public, secret


def decode_reply(raw: bytes) -> dict:
    msg = wire.decode(raw, max_bytes=1 << 30)
    if msg["type"] == "prediction":
        msg["pred"] = wire.unpack_array(msg["pred"], "pred")
        return Prediction(msg)
    if msg["type"] == "weights":
        for part in ("params", "state"):
            msg[part] = {n: wire.unpack_array(a, n, max_elements=1 << 28) for n, a in msg.get(part, {}).items()}
    return msg


class _Timed:
    """A client socket (``self.sock``, ``self.endpoint``) whose sends and receives wait at most
    ``timeout_ms``. ZeroMQ queues messages for a peer it is still connecting to, but once a
    connection was refused (a CURVE handshake the engine turned down: a wrong server key, a
    client key that is not authorised, no key at all) there is no peer to queue for, and a
    plain send would wait forever."""

    @property
    def timeout_ms(self) -> int:
        """How long a send or a receive waits (ms); TimeoutError after it."""
        return self._timeout_ms

    @timeout_ms.setter
    def timeout_ms(self, ms: int):
        self._timeout_ms = int(ms)
        self.sock.setsockopt(zmq.SNDTIMEO, self._timeout_ms)

    def _send(self, frames):
        try:
            self.sock.send_multipart(frames)
        except zmq.Again:
            raise TimeoutError(f"could not hand a message to {self.endpoint} within {self._timeout_ms} ms: no "
                               "connection to the engine (with CURVE: is the server key right and this client's "
                               "key authorised? else: is the engine keeping up?)") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SensorClient(_Timed):
    def __init__(self, endpoint: str = "tcp://127.0.0.1:5555", *, stream: str = "sensor-0", start_seq: int = 0,
                 timeout_s: float = 10.0, ctx: zmq.Context | None = None, server_public_key: bytes | None = None,
                 client_keys: str | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        _curve(self.sock, server_public_key, client_keys)
        self.sock.connect(endpoint)
        self.endpoint, self.stream, self.seq = endpoint, stream, start_seq
        self.timeout_ms = int(timeout_s * 1000)

    def send(self, x, y=None, *, stream: str | None = None, seq: int | None = None, mode: str | None = None) -> int:
        """Queue one step without waiting for its answer; returns its sequence number (a send
        that times out raises TimeoutError and uses no number)."""
        n = self.seq if seq is None else seq
        self.send_raw(wire.data_message(stream or self.stream, n, x, y, ts=time.time(), mode=mode))
        if seq is None:
            self.seq += 1
        return n

    def send_raw(self, raw: bytes):
        self._send([b"", raw])

    def recv(self, *, raise_errors: bool = True) -> dict:
        if not self.sock.poll(self.timeout_ms):
            raise TimeoutError(f"no answer from the engine within {self.timeout_ms} ms")
        frames = self.sock.recv_multipart()
        msg = decode_reply(frames[-1])
        if raise_errors and msg["type"] == "error":
            raise EngineError(msg["code"], msg["message"], msg)
        return msg

    def step(self, x, y=None, *, mode: str | None = None) -> Prediction:
        """Send one step and wait for its prediction. A refused step does not use up its
        sequence number, and a 'gap' error moves the numbering to what the engine expects, so
        the stream goes on with the next call."""
        seq = self.send(x, y, mode=mode)
        msg = self.recv(raise_errors=False)
        if msg["type"] == "error":
            if msg.get("stream") == self.stream and "expected" in msg:
                self.seq = msg["expected"]
            elif msg.get("seq", seq) == seq and self.seq == seq + 1:   # refused unread: seq unused
                self.seq = seq
            raise EngineError(msg["code"], msg["message"], msg)
        return msg

    def label(self, seq: int, y, *, stream: str | None = None) -> dict:
        """The target of the data message ``seq`` sent earlier without one (the engine's
        learning.label_delay); waits for its ``label_ack`` (raises EngineError if refused)."""
        self.send_raw(wire.label_message(stream or self.stream, seq, np.asarray(y)))
        return self.recv()

    def get_weights(self) -> dict:
        self.send_raw(wire.encode({"type": "get_weights"}))
        return self.recv()

    def close(self):
        self.sock.close(0)


class PushClient(_Timed):
    """Fire-and-forget: predictions are published on the engine's PUB socket only."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:5556", *, stream: str = "sensor-0", start_seq: int = 0,
                 timeout_s: float = 10.0, ctx: zmq.Context | None = None, server_public_key: bytes | None = None,
                 client_keys: str | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 1000)
        _curve(self.sock, server_public_key, client_keys)
        self.sock.connect(endpoint)
        self.endpoint, self.stream, self.seq = endpoint, stream, start_seq
        self.timeout_ms = int(timeout_s * 1000)

    def send(self, x, y=None, *, mode: str | None = None) -> int:
        """Queue one step. Non-finite readings are refused here (ValueError) without using a
        sequence number: there is no reply on this path to resynchronise from; so is a send
        that cannot reach the engine within ``timeout_s`` (TimeoutError)."""
        x = np.asarray(x)
        if not np.all(np.isfinite(x)) or (y is not None and not np.all(np.isfinite(y))):
            raise ValueError("x or y contains NaN or Inf; the engine would refuse it")
        seq = self.seq
        self._send([wire.data_message(self.stream, seq, x, y, ts=time.time(), mode=mode)])
        self.seq += 1
        return seq

    def close(self):
        self.sock.close()
