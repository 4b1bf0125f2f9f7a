"""Checks of a config against this machine, before anything is built: the factory's module,
the CPU to pin to, the socket addresses and the Prometheus port (bound and released), the
checkpoint folder, and the CURVE key files. Each problem is a ``ConfigError`` naming its key.

``check_security`` also runs when an ``Engine`` is built directly (without ``serve``): CURVE
must never start open by accident.
"""
from __future__ import annotations

import importlib
import os
import socket
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from .config import ConfigError, EngineConfig

__all__ = ["check_environment", "check_security"]


def check_environment(cfg: EngineConfig):
    _check_factory(cfg.model.factory)
    _check_cpu(cfg.engine.cpu)
    check_security(cfg)
    _check_checkpoint_dir(cfg.checkpoint.dir)
    _check_sockets(cfg)
    if cfg.metrics.prometheus_port:
        _check_tcp_port("metrics.prometheus_port", cfg.metrics.prometheus_addr, cfg.metrics.prometheus_port)


def _check_factory(factory: str):
    if not factory:
        return
    mod_name, _, fn_name = factory.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError("model.factory", f"{factory!r}: cannot import {mod_name!r} ({e})") from None
    except Exception as e:  # noqa: BLE001 - the module's own import code failed
        raise ConfigError("model.factory", f"importing {mod_name!r} raised {type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise ConfigError("model.factory", f"{factory!r}: module {mod_name!r} has no attribute {fn_name!r}")
    if not callable(fn):
        raise ConfigError("model.factory", f"{factory!r} is not a function (type {type(fn).__name__})")


def _check_cpu(cpu: int):
    if cpu < 0:
        return
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):      # no affinity on this platform: the count is all we know
        allowed = list(range(os.cpu_count() or 1))
    if cpu not in allowed:
        shown = f"{allowed[0]}..{allowed[-1]}" if allowed == list(range(allowed[0], allowed[-1] + 1)) else allowed
        raise ConfigError("engine.cpu", f"CPU {cpu} is not available to this process (available: {shown}; "
                          "-1: no pinning)")


def _read_key(key: str, path: str, want_secret: bool):
    p = Path(path)
    if not p.is_file():
        raise ConfigError(key, f"{path!r} does not exist or is not a file")
    try:
        public, secret = zmq.auth.load_certificate(p)
    except (OSError, ValueError) as e:
        raise ConfigError(key, f"{path!r} is not a ZeroMQ certificate ({e}); "
                          "make one with zmq.auth.create_certificates") from None
    for what, k in (("public", public), ("secret", secret)):
        if what == "secret" and not want_secret:
            continue
        if k is None:
            raise ConfigError(key, f"{path!r} holds no {what} key (use the '.key_secret' file of "
                              "zmq.auth.create_certificates)")
        try:
            ok = len(k) == 40 and len(z85.decode(k)) == 32
        except (ValueError, KeyError, IndexError, TypeError):
            ok = False
        if not ok:
            raise ConfigError(key, f"{path!r}: the {what} key is not a 40-character Z85 CURVE key")


def check_security(cfg: EngineConfig):
    """The server key pair loads, and the authorized-client folder exists and holds at least
    one valid public certificate, unless ``allow_any_client`` says otherwise explicitly."""
    sec = cfg.security
    if not sec.curve_secret_key_file:
        if sec.curve_authorized_dir or sec.allow_any_client:   # validate() says so too
            key = "curve_authorized_dir" if sec.curve_authorized_dir else "allow_any_client"
            raise ConfigError(f"security.{key}", "has no effect without security.curve_secret_key_file")
        return
    _read_key("security.curve_secret_key_file", sec.curve_secret_key_file, want_secret=True)
    if not sec.curve_authorized_dir:
        if not sec.allow_any_client:
            raise ConfigError("security.curve_authorized_dir", "required with security.curve_secret_key_file "
                              "(or security.allow_any_client = true)")
        return
    folder = Path(sec.curve_authorized_dir)
    if not folder.is_dir():
        raise ConfigError("security.curve_authorized_dir", f"{str(folder)!r} does not exist or is not a folder: "
                          "no client could connect")
    certs = sorted(folder.glob("*.key"))
    if not certs:
        raise ConfigError("security.curve_authorized_dir", f"{str(folder)!r} holds no client certificates "
                          "(*.key): no client could connect")
    for cert in certs:
        _read_key("security.curve_authorized_dir", str(cert), want_secret=False)


def _check_checkpoint_dir(folder: str):
    if not folder:
        return
    p = Path(folder)
    if p.exists() and not p.is_dir():
        raise ConfigError("checkpoint.dir", f"{folder!r} exists and is not a folder")
    existing = p
    while not existing.exists():      # the engine creates what is missing: the nearest
        existing = existing.parent     # existing folder must let it
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError("checkpoint.dir", f"{folder!r}: {str(existing)!r} is not writable")


def _check_sockets(cfg: EngineConfig):
    """Bind every address once (all at the same time, so two keys naming one endpoint collide)
    and release them; a failure names the key. ipc paths are checked too (length, folder)."""
    ctx = zmq.Context()
    socks = []
    try:
        for key in ("router", "pull", "pub"):
            addr = getattr(cfg.sockets, key)
            if not addr or addr.startswith("inproc://"):
                continue
            s = ctx.socket(zmq.PUB)
            s.setsockopt(zmq.LINGER, 0)
            socks.append(s)
            try:
                s.bind(addr)
            except zmq.ZMQError as e:
                raise ConfigError(f"sockets.{key}", f"cannot listen on {addr!r}: {e}") from None
    finally:
        for s in socks:
            s.close(0)
        ctx.term()


def _check_tcp_port(key, addr, port):
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ConfigError("metrics.prometheus_addr", f"{addr!r}: {e}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
        except OSError as e:
            raise ConfigError(key, f"cannot listen on {addr}:{port}: {e}") from None
