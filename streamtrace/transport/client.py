"""Sensor side: send x (and an optional target), get the prediction back.

``SensorClient`` uses a DEALER socket against the engine's ROUTER: ``step()`` sends one step
and waits for its answer (the lowest-latency path); ``send()`` / ``recv()`` pipeline several.
``PushClient`` is fire-and-forget against the engine's PULL socket (answers go to the PUB
socket only). Sequence numbers are kept per stream by the client, which resyncs them by itself
after the engine or the sensor restarts (streamtrace/transport/numbering.py).
"""
from __future__ import annotations

import time

import numpy as np
import zmq

from .. import wire

from .numbering import NumberedClient
from .replies import EngineError, Prediction, decode_reply

__all__ = ["SensorClient", "PushClient", "EngineError", "Prediction", "decode_reply"]


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


class SensorClient(NumberedClient, _Timed):
    """A sensor's request/reply connection to an engine (its ``[sockets] router``).

    ``step(x)`` sends one step and waits for its :class:`Prediction`; ``send`` / ``recv``
    pipeline several (answers come back in order). Each stream (``stream=`` on every call,
    default the client's) is numbered 0, 1, 2, ... by the client. After the engine or this
    sensor process restarts, the engine's ``repeat`` / ``gap`` refusal names the number it
    expects: the client takes it and sends the step again, without raising and without losing
    it (``resyncs`` counts these, and each is logged on the ``streamtrace.client`` logger).
    Any other refusal raises :class:`EngineError` (``recv(raise_errors=False)`` returns it
    instead) and uses up no number. Nothing waits longer than ``timeout_s``: TimeoutError.

    Parameters
    ----------
    endpoint : the engine's ROUTER endpoint.
    stream : the default stream id (1..128 printable characters).
    start_seq : the default stream's first sequence number (other streams start at 0; a
        wrong guess is resynced).
    timeout_s : how long a send or one answer is waited for.
    ctx : a ZeroMQ context (default: the process's shared one).
    server_public_key, client_keys : CURVE: the engine's public key and this client's key file
        (``streamtrace keys``); none: no encryption.

    Example (with ``streamtrace serve`` running a model of one input)::

        import numpy as np
        from streamtrace.transport import SensorClient, EngineError
        with SensorClient("tcp://127.0.0.1:5555", stream="imu-7") as sensor:
            reply = sensor.step(np.array([0.5], np.float32))     # reply.pred, reply["loss"]
            sensor.send([0.6], stream="imu-8")                    # pipelined, numbered per stream
            other = sensor.recv()
            try:
                sensor.step(np.zeros(3, np.float32))              # a shape the model does not take
            except EngineError as e:
                print(e.code)                                     # bad_shape
    """

    def __init__(self, endpoint: str = "tcp://127.0.0.1:5555", *, stream: str = "sensor-0", start_seq: int = 0,
                 timeout_s: float = 10.0, ctx: zmq.Context | None = None, server_public_key: bytes | None = None,
                 client_keys: str | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        _curve(self.sock, server_public_key, client_keys)
        self.sock.connect(endpoint)
        self.endpoint = endpoint
        self._numbered(stream, start_seq)
        self.timeout_ms = int(timeout_s * 1000)

    @property
    def seq(self) -> int:
        """The default stream's next sequence number."""
        return self.numbering.next.get(self.stream, 0)

    @property
    def _wait_s(self) -> float:
        return self._timeout_ms / 1000

    def _transmit(self, stream: str, seq: int, raw: bytes):
        self._send([b"", raw])

    def _receive(self, timeout_s: float) -> dict:
        if not self.sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no answer from the engine within {int(timeout_s * 1000)} ms")
        return decode_reply(self.sock.recv_multipart()[-1])

    def send_raw(self, raw: bytes):
        """Send bytes as they are (not numbered, never resent)."""
        self._send([b"", raw])

    def label(self, seq: int, y, *, stream: str | None = None) -> dict:
        """The target of the data message ``seq`` sent earlier without one (the engine's
        learning.label_delay); waits for its ``label_ack`` (raises EngineError if refused)."""
        self.send_raw(wire.label_message(stream or self.stream, seq, np.asarray(y)))
        return self.recv()

    def get_weights(self) -> dict:
        """A ``weights`` snapshot of the engine's parameters (``params``: name -> array)."""
        self.send_raw(wire.encode({"type": "get_weights"}))
        return self.recv()

    def close(self):
        self.sock.close(0)


class PushClient(_Timed):
    """Fire-and-forget to the engine's PULL socket (``[sockets] pull``): no answer comes back
    here; predictions and refusals are published on the engine's PUB socket only (topics
    ``pred/<stream>`` and ``error``; :class:`~streamtrace.transport.Subscriber` reads them).

    With no reply there is nothing to resync from: a PushClient restarted while the engine
    still knows its stream must be given the stream's next number (``start_seq``), else its
    steps are refused as ``repeat`` (published on ``error``, counted in the engine's stats). Use
    :class:`SensorClient` where the sensor may restart.

    Parameters
    ----------
    endpoint : the engine's PULL endpoint.
    stream : the stream id of every step.
    start_seq : the first sequence number.
    timeout_s : how long a send waits to be handed to the engine (then TimeoutError).
    ctx, server_public_key, client_keys : as for :class:`SensorClient`.

    Example (with ``streamtrace serve`` running a model of one input)::

        import numpy as np
        from streamtrace.transport import PushClient
        with PushClient("tcp://127.0.0.1:5556", stream="pump-3") as push:
            for v in (0.1, 0.2, 0.3):
                push.send(np.array([v], np.float32))              # returns 0, 1, 2
    """

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
