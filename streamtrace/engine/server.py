"""The ZeroMQ event loop around EngineCore.

Sockets: ROUTER (request/reply ingest: a DEALER gets its own prediction back), PULL
(fire-and-forget ingest), PUB (an XPUB with no-drop sends, so every publication a slow
subscriber could not take is counted; topics ``pred/<stream>``, ``weights``, ``error``, ``stats``).
Every message waiting on the sockets is drained into the core, then one batched step answers
them all. SIGTERM / SIGINT stop the loop; a final checkpoint is written on the way out.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

import zmq
import zmq.auth

from ..learner.checkpoint import CheckpointError
from ..learner.dispatch import inline_dispatch
from .config import ConfigError, EngineConfig
from .compile_cache import disable as disable_compile_cache, enable as enable_compile_cache, resolve
from .core import EngineCore
from .executables import ExecutableStore
from .memory import malloc_trim, release_after_warmup
from .preflight import check_environment, check_security
from .receive import recv_message
from .reply_first import ReplyFirst
from .spin import BusyPoll

__all__ = ["Engine", "serve", "open_engine"]

log = logging.getLogger("streamtrace.engine")

_EVENTS, _POLLIN = zmq.EVENTS, zmq.POLLIN
WARM_JOIN_S = 60.0      # at close, the longest wait for the program being compiled on the warm-up thread
MAX_SKIP = 64            # publications of a refused topic counted as dropped without trying, at most
MAX_REFUSED_TOPICS = 4096


def open_compile_cache(path: str):
    """jax's persistent compilation cache at ``path`` ("": off). A folder that cannot be
    made costs speed, not service: the engine starts without the cache and says so."""
    folder = resolve(path)
    if folder is None:
        disable_compile_cache()
        return None
    try:
        return enable_compile_cache(folder)
    except OSError as e:
        log.warning("engine.compile_cache_dir: cannot use %s (%s); compiling without a cache", folder, e)
        disable_compile_cache()
        return None


class Engine:
    def __init__(self, cfg: EngineConfig, *, ctx: zmq.Context | None = None):
        self.cfg = cfg
        check_security(cfg)           # CURVE never starts open by accident
        if cfg.engine.cpu >= 0:
            os.sched_setaffinity(0, {cfg.engine.cpu})
        if cfg.engine.sync_dispatch:
            inline_dispatch()
        self.cache_dir = open_compile_cache(cfg.engine.compile_cache_dir)
        self.core = EngineCore(cfg)
        # a restart loads its step programs whole, without tracing them (executables.py)
        self.core.learner.programs.store = ExecutableStore.for_config(self.cache_dir, cfg)
        self.resumed = self.core.resume()   # before compiling: a foreign checkpoint refuses fast
        # listen as soon as the first answer can be given; the rest compiles after it (run)
        self.core.warmup_first()
        self._warm_thread = None          # compiles the other programs (run starts it) ...
        self.warm = threading.Event()     # ... and sets this when it is done
        self._released = self._closed = False
        self.ctx = ctx or zmq.Context.instance()
        self._stop = False
        self._auth = None
        self.router = self.pull = self.pub = None
        self._refused: dict[bytes, list] = {}   # topic -> [publications left to skip, last skip]
        self._reply_first = ReplyFirst(self.core.reply_first)
        try:
            self.router = self._socket(zmq.ROUTER, cfg.sockets.router)
            self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self.pull = self._socket(zmq.PULL, cfg.sockets.pull) if cfg.sockets.pull else None
            self.pub = self._publisher(cfg.sockets.pub) if cfg.sockets.pub else None
            if cfg.metrics.prometheus_port:
                try:
                    self.core.metrics.serve_prometheus(cfg.metrics.prometheus_port, cfg.metrics.prometheus_addr)
                except OSError as e:
                    raise ConfigError("metrics.prometheus_port", f"cannot listen on "
                                      f"{cfg.metrics.prometheus_addr}:{cfg.metrics.prometheus_port}: {e}") from None
        except BaseException:   # a socket that cannot bind: release the ones that did
            for s in (self.router, self.pull, self.pub):
                if s is not None:
                    s.close(0)
            if self._auth is not None:
                self._auth.stop()
            raise

    def _publisher(self, addr):
        """PUB as an XPUB with no-drop sends: a publication that a subscriber's full queue
        (sockets.hwm) cannot take is refused at once (zmq.Again, never blocking the loop) and
        counted per topic, instead of vanishing as a PUB socket would let it. ZeroMQ refuses it
        for every subscriber of that topic, so each one sees exactly the counted gaps."""
        s = self._socket(zmq.XPUB, addr)
        s.setsockopt(zmq.XPUB_NODROP, 1)
        return s

    def _waiting(self) -> bool:
        """Whether a message waits on the ROUTER or the PULL socket."""
        return bool(self.router.getsockopt(_EVENTS) & _POLLIN) or \
            (self.pull is not None and bool(self.pull.getsockopt(_EVENTS) & _POLLIN))

    def _drain_subscriptions(self):
        """An XPUB hands subscriptions to the application: read them so they do not pile up."""
        try:
            while self.pub.getsockopt(_EVENTS) & _POLLIN:
                self.pub.recv(zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _socket(self, kind, addr):
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, self.cfg.sockets.hwm)
        s.setsockopt(zmq.RCVHWM, self.cfg.sockets.hwm)
        # oversize messages up to twice the limit still get a "too_large" reply; beyond that
        # ZeroMQ drops the peer's connection before the bytes are buffered
        s.setsockopt(zmq.MAXMSGSIZE, 2 * self.cfg.engine.max_message_bytes + 65536)
        sec = self.cfg.security
        if sec.curve_secret_key_file:
            if self._auth is None:
                from zmq.auth.thread import ThreadAuthenticator
                self._auth = ThreadAuthenticator(self.ctx)
                self._auth.start()
                if sec.curve_authorized_dir:
                    self._auth.configure_curve(domain="*", location=sec.curve_authorized_dir)
                else:   # check_security let this through only with allow_any_client = true
                    log.warning("security.allow_any_client = true: ANY client key may connect (traffic is "
                                "encrypted, clients are NOT authenticated); set security.curve_authorized_dir")
                    self._auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
            public, secret = zmq.auth.load_certificate(sec.curve_secret_key_file)
            s.curve_publickey, s.curve_secretkey, s.curve_server = public, secret, True
        try:
            s.bind(addr)
        except zmq.ZMQError as e:
            s.close(0)
            key = {zmq.ROUTER: "router", zmq.PULL: "pull", zmq.XPUB: "pub"}.get(kind, "router")
            raise ConfigError(f"sockets.{key}", f"cannot listen on {addr!r}: {e}") from None
        return s

    @property
    def endpoints(self) -> dict:
        return {name: sock.getsockopt(zmq.LAST_ENDPOINT).decode()
                for name, sock in (("router", self.router), ("pull", self.pull), ("pub", self.pub)) if sock}

    def start_warmup(self):
        """Compile the remaining programs (subset calls, micro-batch sizes, slot reset and
        parking) on a thread of their own while this one serves with what is compiled: no
        message waits for the compiler, and whichever program serves a message, its answer
        is the same bits (every program rounds alike: learner/xla_options.py). The serving
        thread gives back what compiling kept once the thread is done."""
        def work():
            try:
                for _ in self.core.warmup_later():
                    if self._closed:        # a closed engine needs no more programs
                        break
            except Exception:   # noqa: BLE001 - serve on with the programs compiled so far
                log.exception("compiling a program failed; serving with micro-batch sizes %s and subsets %s",
                              self.core.ready, self.core.ready_subsets)
            self.warm.set()
        self._warm_thread = threading.Thread(target=work, name="streamtrace-warmup", daemon=True)
        self._warm_thread.start()

    def stop(self, *_):
        self._stop = True

    def _send(self, outs):
        for kind, dest, raw in outs:
            if kind == "reply":
                try:
                    self.router.send_multipart([dest, raw], flags=zmq.NOBLOCK)
                except (zmq.Again, zmq.ZMQError):
                    self.core.metrics.count("reply_failures")
            elif self.pub is not None:
                self._publish(dest, raw)

    def _publish(self, topic: bytes, raw: bytes):
        """Send on the XPUB; a refused send (a subscriber's queue full) is counted as dropped.
        After a refusal the next 1, 2, 4 .. MAX_SKIP publications of that topic are counted as
        dropped without trying (a refused try costs more than a send; measured:
        docs/decisions/step-details.md), so a stalled subscriber barely slows the engine; the
        first accepted send ends the skipping."""
        skip = self._refused.get(topic)
        if skip is not None and skip[0] > 0:
            skip[0] -= 1
            self.core.metrics.pub_drop(topic)
            return
        try:
            self.pub.send_multipart([topic, raw], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.core.metrics.pub_drop(topic)
            if skip is None:
                if len(self._refused) >= MAX_REFUSED_TOPICS:
                    self._refused.clear()
                skip = self._refused[topic] = [0, 0]
            skip[1] = min(2 * skip[1] or 1, MAX_SKIP)
            skip[0] = skip[1]
            return
        if skip is not None:
            del self._refused[topic]

    def install_signals(self):
        """SIGTERM / SIGINT stop the loop (and write the final checkpoint) from here on."""
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def run(self, *, install_signals: bool = True, max_seconds: float | None = None):
        if install_signals:
            self.install_signals()
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        if self.pull is not None:
            poller.register(self.pull, zmq.POLLIN)
        core, clock = self.core, time.monotonic
        stats_every = self.cfg.publish.stats_every_s
        next_stats = clock() + stats_every
        # the other programs compile on a thread once the first answer is out (its tracing holds
        # the GIL in slices, which would delay that answer) or after a quiet first second
        warm_at = clock() + 1.0
        deadline = None if max_seconds is None else clock() + max_seconds
        # read at most this much before stepping: one stream's queue then never passes
        # engine.max_pending, and what waits beyond it stays in ZeroMQ (back-pressure)
        spin = BusyPoll(self.cfg.engine.busy_poll_us)
        drain_max = min(self.cfg.engine.slots * self.cfg.engine.micro_batch, self.cfg.engine.max_pending)
        max_bytes = self.cfg.engine.max_message_bytes
        try:
            while not self._stop:
                pending = core.has_pending()
                timeout = spin.timeout_ms(clock(), pending)
                events = dict(poller.poll(timeout))
                if not events and timeout == 0 and not pending:
                    spin.idle_turn()
                from_router, from_pull = bool(events.get(self.router)), bool(events.get(self.pull))
                for _ in range(drain_max):  # drain what waits, then step once for all of it
                    # a socket is read again only while it says a message waits (asking is
                    # cheaper than the zmq.Again exception of an empty read)
                    if from_router:
                        try:
                            m = recv_message(self.router, routed=True, max_bytes=max_bytes)
                            outs = (core.ingest(m.payload, m.identity) if m.error is None
                                    else _refused(core, m.identity, m.error))
                            if outs:             # a queued message answers at the step
                                self._send(outs)
                            from_router = self.router.getsockopt(_EVENTS) & _POLLIN
                        except zmq.Again:
                            from_router = False
                    if from_pull:
                        try:
                            m = recv_message(self.pull, routed=False, max_bytes=max_bytes)
                            outs = core.ingest(m.payload, None) if m.error is None else _refused(core, None, m.error)
                            if outs:
                                self._send(outs)
                            from_pull = self.pull.getsockopt(_EVENTS) & _POLLIN
                        except zmq.Again:
                            from_pull = False
                    if not (from_router or from_pull):
                        break
                busy = bool(events) or core.has_pending()
                # nothing else waits (the drain emptied the sockets): a reply may go out before
                # its update runs (engine.reply_first, reply_first.py); under load one call a
                # step, as before
                early = self._reply_first.sender(self._send, quiet=not (from_router or from_pull))
                first = False
                while core.has_pending():
                    self._send(core.tick(early))
                    first = first or core.replied_first
                if first:       # did the update hold up a message that came meanwhile?
                    self._reply_first.outcome(self._waiting())
                now = clock()
                if busy:
                    spin.busy(now)
                if self._warm_thread is None and (core.steps or now >= warm_at):
                    self.start_warmup()
                elif not self._released and self.warm.is_set():
                    self._released = True     # every program compiled: drop what compiling kept
                    release_after_warmup()
                if now >= next_stats:
                    next_stats = now + stats_every
                    core.evict_idle(now)
                    if self.pub is not None:
                        self._drain_subscriptions()
                        self._send([("pub", b"stats", core.stats_message())])
                if deadline is not None and now > deadline:
                    break
        finally:
            self.close()

    def close(self):
        self._closed = True
        if self._warm_thread is not None:
            # a process that exits while XLA compiles on another thread can abort (seen: SIGABRT
            # at exit, jax 0.12): let the program being compiled finish (the thread stops after it)
            self._warm_thread.join(WARM_JOIN_S)
        try:
            while self.core.has_pending():
                self._send(self.core.tick())
            self.core.save_checkpoint()
        finally:
            for s in (self.router, self.pull, self.pub):
                if s is not None:
                    s.close(0)
            if self._auth is not None:
                self._auth.stop()


def open_engine(cfg: EngineConfig) -> Engine:
    """The engine for a validated config, ready to ``run``. Anything in the config that this
    machine or the checkpoint folder cannot honour is a ConfigError naming the key."""
    check_environment(cfg)
    try:
        return Engine(cfg)
    except CheckpointError as e:
        raise ConfigError("checkpoint.dir", f"{cfg.checkpoint.dir!r} holds checkpoints this engine cannot "
                          f"resume; refusing to start rather than overwrite them (point checkpoint.dir "
                          f"elsewhere or move them away): {e}") from None
    except ConfigError:
        raise
    except ValueError as e:
        # the model the config builds does not fit the config's sizes / mode
        text = str(e)
        named = [(text.find(k), k) for k in ("model.n_in", "model.n_out") if k in text]
        blamed = min(named)[1] if named else None
        if blamed is None and "forecast" in text:
            blamed = "learning.mode"
        if blamed is None and type(e).__name__ != "CompileError":
            raise
        raise ConfigError(blamed or ("model.factory" if cfg.model.factory else "model.stack"),
                          f"{type(e).__name__}: {text}" if type(e).__name__ == "CompileError" else text) from None


def serve(cfg: EngineConfig, *, announce=print) -> int:
    exposed = cfg.exposed_remotely()
    if exposed and not cfg.security.curve_secret_key_file:
        announce(f"WARNING: {', '.join(exposed)} listen beyond loopback without CURVE authentication; "
                 "set security.curve_secret_key_file for remote sensors")
    if cfg.security.curve_secret_key_file and cfg.security.allow_any_client:
        announce("WARNING: security.allow_any_client = true: ANY client key may connect (encrypted, NOT "
                 "authenticated); set security.curve_authorized_dir to admit only known sensors")
    engine = open_engine(cfg)
    if engine.resumed:
        for w in engine.resumed.get("warnings", []):
            announce(f"WARNING: {w}")
        announce(f"resumed from {engine.resumed['path']} at step {engine.core.steps} "
                 f"(a crash loses at most {cfg.checkpoint.every} steps)")
    # before the announcement: whoever waits for it may stop us at once, and must stop us cleanly
    engine.install_signals()
    announce(f"streamtrace engine: {engine.endpoints}; model {cfg.model.factory or cfg.model.stack} "
             f"{cfg.model.n_in}->{cfg.model.n_hidden}->{cfg.model.n_out}, {cfg.learning.algorithm}, "
             f"{cfg.learning.mode}, {cfg.engine.slots} slots")
    engine.run()
    announce(f"stopped after {engine.core.steps} steps")
    return 0


_TRIMMED = [0.0]      # when the heap was last given back (at most ten times a second)


def _refused(core, origin, error) -> list:
    """A message refused for its framing or size: counted and answered; the heap pages its
    frames went through are given back, at most ten times a second (glibc would otherwise keep
    hundreds of MB of freed pages; a sender of many bad messages must not make every one cost
    a trim)."""
    out = core.reject(origin, *error)
    now = time.monotonic()
    if now - _TRIMMED[0] >= 0.1:
        _TRIMMED[0] = now
        malloc_trim()
    return out
