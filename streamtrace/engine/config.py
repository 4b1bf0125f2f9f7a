"""Engine configuration: a TOML file whose every key has a default that just works.

A serve config is a learner's recipe (``streamtrace.recipe``: ``[model]``, ``[learning]``, ...)
plus the server's sections (``[engine]``, ``[sockets]``, ``[publish]``, ``[checkpoint]``,
``[security]``, ``[metrics]``'s Prometheus keys).

>>> cfg = load_config(overrides={"engine": {"slots": 4}})
>>> cfg.engine.slots, cfg.model.stack           # no model named: the default learner
(4, 'reservoir')
"""
from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from ..recipe.checks import int_range, positive
from ..recipe.errors import ConfigError
from ..recipe.load import fill_config
from ..recipe.recipe import Recipe
from ..recipe.sections import (CombineConfig, InputTransformConfig, LearnedConfig, LearningConfig, MetricsConfig,
                               ModelConfig, ReadoutConfig, ReservoirConfig, ScreenConfig, StreamConfig)
from ..recipe.toml import fill_section, read_toml, stream_section
from .quantities import QUANTITY_KEYS

__all__ = ["EngineConfig", "load_config", "ConfigError", "stream_section", "fill_section", "read_toml",
           "ServerMetricsConfig", "EngineSection", "SocketsConfig", "PublishConfig", "CheckpointConfig",
           "SecurityConfig", "StreamConfig", "ModelConfig", "ReservoirConfig", "InputTransformConfig",
           "ReadoutConfig", "LearningConfig", "LearnedConfig", "CombineConfig", "ScreenConfig"]

_SCHEMES = ("tcp", "ipc", "inproc")


@dataclass
class EngineSection:
    slots: int = 16
    shared_weights: bool = False  # one model per stream by default: streams cannot disturb each other
    idle_timeout_s: float = 60.0
    micro_batch: int = 8          # most pending steps of one stream run in one call
    max_pending: int = 256        # per stream; beyond it messages are refused as "overloaded"
    max_message_bytes: int = 1 << 20
    cpu: int = -1                 # pin the engine to this CPU (-1: no pinning)
    busy_poll_us: int = 5000      # a sender at most this far apart finds the loop polling, not
                                  # asleep: no wake-up per message (0: off; never with one CPU; a
                                  # 200 Hz+ sensor keeps one CPU busy: engine/spin.py)
    reply_first: bool = True      # when nothing else waits, send a one-step call's replies before
                                  # its update runs, where the prediction does not depend on it
                                  # (supervised; forecast with learning.forecast_before_update)
    sync_dispatch: bool = True    # run each compiled step on the calling thread: every step is
                                  # awaited anyway, and a hand-off to jax's worker thread costs
                                  # a cross-thread wake-up per message
    on_gap: str = "reject"        # a sequence gap: "reject" the message, or "accept" and count it
    park_s: float = 3600.0        # an idle-evicted stream's state is kept this long and restored
                                  # when it returns (0: off, a returning stream starts fresh)
    max_parked: int = 256         # most parked streams (oldest dropped first): bounds the memory
    compile_cache_dir: str = "~/.cache/streamtrace/jax"   # jax's persistent compilation cache: a
                                  # restart loads the compiled step instead of compiling ("": off)


@dataclass
class SocketsConfig:
    router: str = "tcp://127.0.0.1:5555"   # request/reply ingest (a DEALER gets its prediction back)
    pull: str = "tcp://127.0.0.1:5556"     # fire-and-forget ingest
    pub: str = "tcp://127.0.0.1:5557"      # predictions, weights, errors, stats
    hwm: int = 10000                        # ZeroMQ high-water mark on every socket


@dataclass
class PublishConfig:
    weights_every: int = 100      # publish weights every N processed steps (0: never)
    stats_every_s: float = 1.0
    predictions: bool = True      # also publish every prediction on "pred/<stream>"
    signal: bool = True           # a published prediction also carries its sample's signal (the
                                  # target y when given, else the input x): what a dashboard plots


@dataclass
class CheckpointConfig:
    dir: str = ""                 # "" disables checkpoints
    every: int = 1000             # at most this many steps can be lost in a crash
    keep: int = 3


@dataclass
class SecurityConfig:
    curve_secret_key_file: str = ""   # server key pair (zmq.auth.create_certificates): enables CURVE
    curve_authorized_dir: str = ""    # folder of client public certificates allowed to connect
    allow_any_client: bool = False    # with a server key but no authorized folder: any client key
                                      # gets in (encrypted, not authenticated); logged loudly


@dataclass
class ServerMetricsConfig(MetricsConfig):   # [metrics]: the learner's window, and Prometheus
    prometheus_port: int = 0      # 0 = off; served on 127.0.0.1
    prometheus_addr: str = "127.0.0.1"


@dataclass
class EngineConfig(Recipe):
    """A serve config: the learner's recipe (every ``Recipe`` section) and the server's sections.

    Parameters
    ----------
    engine, sockets, publish, checkpoint, security, metrics, bridge
        The server's sections (``[bridge.*]`` is read and checked by the bridges); the recipe's
        sections as in ``Recipe``.

    >>> EngineConfig().sockets.router
    'tcp://127.0.0.1:5555'
    """
    metrics: ServerMetricsConfig = field(default_factory=ServerMetricsConfig)
    engine: EngineSection = field(default_factory=EngineSection)
    sockets: SocketsConfig = field(default_factory=SocketsConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # [bridge.lsl], [bridge.mqtt]: read and checked by the bridges (streamtrace.adapters), not the engine
    bridge: dict = field(default_factory=dict)

    @property
    def recipe(self) -> Recipe:
        """The learner's part of this config, as a ``Recipe`` (its sections shared, not copied)."""
        return Recipe(**{name: getattr(self, name) for name in Recipe.__dataclass_fields__})

    def validate(self) -> "EngineConfig":
        """The recipe's checks, then the server's; what needs the machine (files, ports, CPUs,
        the factory's module) is checked by ``engine.preflight``. Sections in a fixed order: with
        several bad values, the first one found is the one named. Returns ``self``."""
        self.validate_recipe()
        self._validate_engine()
        self._validate_outputs()
        self._validate_security()
        self._validate_metrics()
        return self

    @staticmethod
    def _resolve(cfg):
        from .quantities import resolve
        resolve(cfg)

    def _validate_engine(self):
        m, e = self.model, self.engine
        int_range("engine.slots", e.slots, 1, 1_000_000)
        int_range("engine.micro_batch", e.micro_batch, 1, 4096)
        int_range("engine.max_pending", e.max_pending, 1, 10_000_000)
        if not (math.isfinite(e.park_s) and e.park_s >= 0):
            raise ConfigError("engine.park_s", f"must be >= 0 seconds (0: off); got {e.park_s}")
        int_range("engine.max_parked", e.max_parked, 1, 1_000_000)
        if not e.idle_timeout_s >= 0:    # inf is fine: streams are never evicted
            raise ConfigError("engine.idle_timeout_s", f"must be >= 0 seconds; got {e.idle_timeout_s}")
        smallest = 512 + 8 * (m.n_in + m.n_out)
        int_range("engine.max_message_bytes", e.max_message_bytes, smallest, 1 << 30,
                   f" (a data message of n_in + n_out float64 values and a 128-character stream name "
                   f"needs up to ~{smallest} bytes)")
        int_range("engine.cpu", e.cpu, -1, 1 << 20, " (-1: no pinning)")
        int_range("engine.busy_poll_us", e.busy_poll_us, 0, 1_000_000, " (0: off)")
        if "\x00" in e.compile_cache_dir:
            raise ConfigError("engine.compile_cache_dir", "must be a folder path (or '' for no cache); "
                              "it contains a NUL character")
        if e.on_gap not in ("reject", "accept"):
            raise ConfigError("engine.on_gap", f"{e.on_gap!r}: choose 'reject' or 'accept'")

    def _validate_outputs(self):
        """Sockets, publishing and checkpoints."""
        seen = {}
        for key in ("router", "pull", "pub"):
            addr = getattr(self.sockets, key)
            if not addr and key == "router":
                raise ConfigError("sockets.router", "required (sensors send to it), e.g. 'tcp://127.0.0.1:5555'")
            if addr:
                _check_address(f"sockets.{key}", addr)
                if addr in seen:
                    raise ConfigError(f"sockets.{key}", f"{addr!r} is also sockets.{seen[addr]}")
                seen[addr] = key
        int_range("sockets.hwm", self.sockets.hwm, 0, 2**31 - 1, " (0: no limit)")
        int_range("publish.weights_every", self.publish.weights_every, 0, 2**62, " (0: never)")
        positive("publish.stats_every_s", self.publish.stats_every_s)
        int_range("checkpoint.every", self.checkpoint.every, 1, 2**62)
        int_range("checkpoint.keep", self.checkpoint.keep, 1, 1_000_000)

    def _validate_security(self):
        sec = self.security
        if sec.curve_secret_key_file:
            if sec.curve_authorized_dir and sec.allow_any_client:
                raise ConfigError("security.allow_any_client", "contradicts security.curve_authorized_dir "
                                  "(which admits only its keys): set one of them")
            if not sec.curve_authorized_dir and not sec.allow_any_client:
                raise ConfigError("security.curve_authorized_dir", "required with security.curve_secret_key_file: "
                                  "a folder of the client public certificates allowed in (or set "
                                  "security.allow_any_client = true to let any client key in)")
        else:
            for name in ("curve_authorized_dir", "allow_any_client"):
                if getattr(sec, name):
                    raise ConfigError(f"security.{name}", "has no effect without security.curve_secret_key_file "
                                      "(the server's CURVE key): nothing would be authenticated")

    def _validate_metrics(self):
        int_range("metrics.prometheus_port", self.metrics.prometheus_port, 0, 65535, " (0: off)")
        if self.metrics.prometheus_port and not self.metrics.prometheus_addr:
            raise ConfigError("metrics.prometheus_addr", "required with metrics.prometheus_port")

    def exposed_remotely(self) -> list[str]:
        """Socket addresses that listen beyond loopback."""
        out = []
        for addr in (self.sockets.router, self.sockets.pull, self.sockets.pub):
            u = urlparse(addr)
            if u.scheme != "tcp":
                continue
            host = u.hostname or ""
            try:
                if not ipaddress.ip_address(host).is_loopback:
                    out.append(addr)
            except ValueError:
                if host not in ("localhost",):
                    out.append(addr)
        return out



def _check_address(key, addr):
    scheme, sep, rest = addr.partition("://")
    if not sep or scheme not in _SCHEMES or not rest:
        raise ConfigError(key, f"{addr!r} is not a ZeroMQ address: write e.g. 'tcp://127.0.0.1:5555' "
                          f"or 'ipc:///tmp/streamtrace.sock' (schemes: {', '.join(_SCHEMES)})")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host or not (port == "*" or (port.isdigit() and int(port) <= 65535)):
            raise ConfigError(key, f"{addr!r}: a tcp address is 'tcp://<host or interface>:<port 0..65535 or *>'")



def load_config(path: str | Path | None = None, overrides: dict | None = None) -> EngineConfig:
    """The validated serve config of the TOML file ``path`` and the ``overrides`` tables (either
    may be None), the default learner's keys filled in where neither names a model.

    Parameters
    ----------
    path : str or Path, optional
        The TOML file (``streamtrace serve --config``).
    overrides : dict, optional
        Tables applied after the file, e.g. ``{"engine": {"slots": 4}}``.

    Returns
    -------
    EngineConfig
        Raises ``ConfigError`` naming the first bad key.
    """
    return fill_config(EngineConfig(), path, overrides, QUANTITY_KEYS)


_MOVED = {"DEFAULT_LEARNER": "defaults", "make_optimizer": "optimizers", "change_detector": "optimizers",
          "OPTIMIZERS": "optimizers", "config_modes": "recipe", "FEATURE_MODELS": "recipe", "MAX_UNITS": "recipe"}


def __getattr__(name):
    if name in _MOVED:
        import importlib
        import warnings
        where = f"streamtrace.recipe.{_MOVED[name]}"
        warnings.warn(f"streamtrace.engine.config.{name} moved to {where}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(where), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
