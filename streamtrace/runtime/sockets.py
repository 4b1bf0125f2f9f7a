"""Listening sockets as ``serve`` opens them: bounded queues and message sizes, CURVE when a
server key is given (only known client keys, or any key when asked), bound or refused in one
line. Shared by the engine and the runner (jax-free).

>>> import zmq
>>> ctx = zmq.Context()
>>> s = bind(ctx, zmq.ROUTER, "inproc://doc", hwm=100, max_message_bytes=1024)
>>> s.getsockopt(zmq.RCVHWM)
100
>>> s.close(0); ctx.term()
"""
from __future__ import annotations

import logging

import zmq
import zmq.auth

__all__ = ["Curve", "bind", "BindError"]

log = logging.getLogger("streamtrace.runtime")


class BindError(OSError):
    """An address that cannot be listened on (in use, bad interface); names it."""


class Curve:
    """CURVE for a server's sockets: its key pair file and who may connect (a folder of client
    public certificates, or ``allow_any``: any client key, encrypted but not authenticated). One
    authenticator thread per ZeroMQ context, started with the first socket."""

    def __init__(self, secret_key_file: str, authorized_dir: str = "", allow_any: bool = False):
        self.secret_key_file, self.authorized_dir, self.allow_any = secret_key_file, authorized_dir, allow_any
        self._auth = None

    def apply(self, ctx, sock):
        if self._auth is None:
            from zmq.auth.thread import ThreadAuthenticator
            self._auth = ThreadAuthenticator(ctx)
            self._auth.start()
            if self.authorized_dir:
                self._auth.configure_curve(domain="*", location=self.authorized_dir)
            else:
                log.warning("allow_any_client: ANY client key may connect (traffic is encrypted, clients are NOT "
                            "authenticated); give a folder of authorized client certificates instead")
                self._auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        public, secret = zmq.auth.load_certificate(self.secret_key_file)
        sock.curve_publickey, sock.curve_secretkey, sock.curve_server = public, secret, True

    def stop(self):
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


def bind(ctx, kind, addr: str, *, hwm: int, max_message_bytes: int, curve: Curve | None = None):
    """A socket of ``kind`` listening on ``addr``: no linger, ``hwm`` queues, messages up to twice
    ``max_message_bytes`` (so an oversize one still gets its ``too_large`` reply; beyond that ZeroMQ
    drops the peer's connection before buffering it), CURVE when given. Raises ``BindError``."""
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, hwm)
    s.setsockopt(zmq.RCVHWM, hwm)
    s.setsockopt(zmq.MAXMSGSIZE, 2 * max_message_bytes + 65536)
    if curve is not None:
        curve.apply(ctx, s)
    try:
        s.bind(addr)
    except zmq.ZMQError as e:
        s.close(0)
        raise BindError(f"cannot listen on {addr!r}: {e}") from None
    return s
