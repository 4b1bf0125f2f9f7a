"""The runner's ZeroMQ loop around ``core.RunnerCore``: the sockets of ``serve`` (ROUTER for
request/reply, PULL for fire-and-forget, PUB for predictions, weights, errors and stats), on
loopback by default, CURVE when a server key is given. SIGTERM / SIGINT stop the loop; a final
checkpoint is written on the way out. A data message read while nothing else waits may be
answered before its step (``core.reply_first``; when, as ``serve`` decides it: reply_first.py).
Between messages that come close together the loop polls without sleeping, as ``serve``'s
(``--busy-poll-us``, spin.py: never with one CPU)."""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass

import zmq

from .core import RunnerCore
from .lazy_log import LazyLogger
from .receive import recv_message
from .reply_first import ReplyFirst
from .spin import BusyPoll

__all__ = ["RunnerServer", "Sockets"]

log = LazyLogger("streamtrace.runner")


@dataclass
class Sockets:
    """Addresses ("" : no such socket) and CURVE, named as ``serve``'s sockets.* / security.* keys."""
    router: str = "tcp://127.0.0.1:5555"
    pull: str = "tcp://127.0.0.1:5556"
    pub: str = "tcp://127.0.0.1:5557"
    hwm: int = 10000
    curve_secret_key_file: str = ""
    curve_authorized_dir: str = ""
    allow_any_client: bool = False


class RunnerServer:
    """Serves ``core`` on ``sockets``; ``run()`` until SIGTERM / SIGINT or ``max_seconds``.

    >>> import tempfile, numpy as np
    >>> from streamtrace.export.write import export_learner     # (where streamtrace is installed)
    >>> from streamtrace_runner.runtime import Runner
    >>> from streamtrace_runner.bank import RunnerBank
    >>> from streamtrace_runner.core import Options
    >>> folder = tempfile.mkdtemp(); _ = export_learner(None, folder)
    >>> core = RunnerCore(RunnerBank(Runner(folder), 2), Options(slots=2))
    >>> server = RunnerServer(core, Sockets(router="tcp://127.0.0.1:0", pull="", pub=""))
    >>> sorted(server.endpoints)
    ['router']
    >>> server.close()
    """

    def __init__(self, core: RunnerCore, sockets: Sockets, ctx: zmq.Context | None = None):
        if sockets.curve_secret_key_file and not (sockets.curve_authorized_dir or sockets.allow_any_client):
            raise ValueError("CURVE needs curve_authorized_dir (the client keys admitted) or allow_any_client")
        self.core, self.cfg = core, sockets
        self.ctx = ctx or zmq.Context.instance()
        self._auth, self._stop, self.sockets = None, False, {}
        self._reply_first = ReplyFirst(core.reply_first)
        try:
            for name, kind in (("router", zmq.ROUTER), ("pull", zmq.PULL), ("pub", zmq.PUB)):
                if getattr(sockets, name):
                    self.sockets[name] = self._socket(kind, getattr(sockets, name))
            self.sockets["router"].setsockopt(zmq.ROUTER_MANDATORY, 1)
        except BaseException:
            self.close(save=False)
            raise

    def _socket(self, kind, addr):
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, self.cfg.hwm)
        s.setsockopt(zmq.RCVHWM, self.cfg.hwm)
        s.setsockopt(zmq.MAXMSGSIZE, 2 * self.core.opt.max_message_bytes + 65536)
        if self.cfg.curve_secret_key_file:
            from zmq import auth          # (CURVE only: not imported otherwise)
            if self._auth is None:
                from zmq.auth.thread import ThreadAuthenticator
                self._auth = ThreadAuthenticator(self.ctx)
                self._auth.start()
                self._auth.configure_curve(domain="*", location=self.cfg.curve_authorized_dir or auth.CURVE_ALLOW_ANY)
            s.curve_publickey, s.curve_secretkey = auth.load_certificate(self.cfg.curve_secret_key_file)
            s.curve_server = True
        try:
            s.bind(addr)
        except zmq.ZMQError as e:
            s.close(0)
            raise ValueError(f"cannot listen on {addr!r}: {e}") from None
        return s

    @property
    def endpoints(self) -> dict:
        return {name: s.getsockopt(zmq.LAST_ENDPOINT).decode() for name, s in self.sockets.items()}

    def stop(self, *_):
        self._stop = True

    def install_signals(self):
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def _send(self, outs):
        router, pub = self.sockets["router"], self.sockets.get("pub")
        for kind, dest, raw in outs:
            try:
                # copy=False: a frame over pyzmq's copy threshold (a weights message) is handed
                # to ZeroMQ as it is, not copied first (small ones are copied either way)
                if kind == "reply":
                    router.send_multipart([dest, raw], flags=zmq.NOBLOCK, copy=False)
                elif pub is not None:
                    pub.send_multipart([dest, raw], flags=zmq.NOBLOCK, copy=False)
            except (zmq.Again, zmq.ZMQError):
                if kind == "reply":
                    self.core.metrics.count("reply_failures")
                else:
                    self.core.metrics.pub_drop(dest)

    def _waiting(self) -> bool:
        """Whether a message waits on the ROUTER or the PULL socket."""
        return any(self.sockets[name].getsockopt(zmq.EVENTS) & zmq.POLLIN
                   for name in ("router", "pull") if name in self.sockets)

    def _read(self, sock, routed: bool):
        m = recv_message(sock, routed=routed, max_bytes=self.core.opt.max_message_bytes)
        origin = m.identity if routed else None
        if m.error is not None:
            return self.core.reject(origin, *m.error)
        # nothing else waits: its replies may leave before its step runs (reply_first.py)
        early = self._reply_first.sender(self._send, quiet=not self._waiting()) if self._reply_first.enabled else None
        out = self.core.ingest(m.payload, origin, early)
        if self.core.replied_first:     # did the step hold up a message that came meanwhile?
            self._reply_first.outcome(self._waiting())
        return out

    def run(self, max_seconds: float | None = None):
        """Answer messages until stopped; then the final checkpoint and the sockets closed."""
        poller = zmq.Poller()
        for name in ("router", "pull"):
            if name in self.sockets:
                poller.register(self.sockets[name], zmq.POLLIN)
        clock, every = time.monotonic, self.core.opt.stats_every_s
        next_stats = clock() + every
        deadline = None if max_seconds is None else clock() + max_seconds
        spin = BusyPoll(self.core.opt.busy_poll_us)
        try:
            while not self._stop:
                timeout = spin.timeout_ms(clock(), False)
                events = dict(poller.poll(timeout))
                if not events and timeout == 0:
                    spin.idle_turn()
                for sock in events:
                    routed = sock is self.sockets["router"]
                    while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN and not self._stop:
                        try:
                            self._send(self._read(sock, routed))
                        except zmq.Again:
                            break
                now = clock()
                if events:
                    spin.busy(now)
                if now >= next_stats:
                    next_stats = now + every
                    self.core.evict_idle(now)
                    self._send([("pub", b"stats", self.core.stats_message())])
                if deadline is not None and now > deadline:
                    break
        finally:
            self.close()

    def close(self, save: bool = True):
        try:
            if save:
                self.core.save_checkpoint()
        finally:
            for s in self.sockets.values():
                s.close(0)
            if self._auth is not None:
                self._auth.stop()
