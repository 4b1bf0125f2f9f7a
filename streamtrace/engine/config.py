"""Engine configuration: a TOML file whose every key has a default that just works."""
from __future__ import annotations

import importlib
import ipaddress
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["EngineConfig", "load_config", "build_model", "ConfigError"]


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type, or inconsistent."""


@dataclass
class ModelConfig:
    stack: str = "gru"           # a built-in stack (streamtrace.nn.STACKS) ...
    factory: str = ""            # ... or "package.module:function" returning a brainstate module
    n_in: int = 1
    n_hidden: int = 32
    n_out: int = 1
    readout: str = ""            # "", "linear" or "leaky"
    seed: int = 0


@dataclass
class LearningConfig:
    algorithm: str = "d-rtrl"    # d-rtrl, es-d-rtrl, rtrl
    decay: float = 0.0           # es-d-rtrl trace decay (0 = use rank or the default 0.9)
    rank: float = 0.0
    mode: str = "forecast"       # forecast (target = next input) or supervised
    optimizer: str = "adam"      # adam, sgd, rmsprop, adamw
    lr: float = 1e-3
    clip: float = 0.0            # global-norm gradient clipping; 0 = off
    learn_every: int = 1


@dataclass
class EngineSection:
    slots: int = 16
    shared_weights: bool = False  # one model per stream by default: streams cannot disturb each other
    idle_timeout_s: float = 60.0
    micro_batch: int = 8          # most pending steps of one stream run in one call
    max_pending: int = 256        # per stream; beyond it messages are refused as "overloaded"
    max_message_bytes: int = 1 << 20
    cpu: int = -1                 # pin the engine to this CPU (-1: no pinning)
    sync_dispatch: bool = True    # run each compiled step on the calling thread: every step is
                                  # awaited anyway, and a hand-off to jax's worker thread costs
                                  # a cross-thread wake-up per message
    on_gap: str = "reject"        # a sequence gap: "reject" the message, or "accept" and count it
    park_s: float = 3600.0        # an idle-evicted stream's state is kept this long and restored
                                  # when it returns (0: off, a returning stream starts fresh)
    max_parked: int = 256         # most parked streams (oldest dropped first): bounds the memory


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


@dataclass
class CheckpointConfig:
    dir: str = ""                 # "" disables checkpoints
    every: int = 1000             # at most this many steps can be lost in a crash
    keep: int = 3


@dataclass
class SecurityConfig:
    curve_secret_key_file: str = ""   # server key pair (zmq.auth.create_certificates): enables CURVE
    curve_authorized_dir: str = ""    # folder of client public certificates allowed to connect


@dataclass
class MetricsConfig:
    prometheus_port: int = 0      # 0 = off; served on 127.0.0.1
    prometheus_addr: str = "127.0.0.1"


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    learning: LearningConfig = field(default_factory=LearningConfig)
    engine: EngineSection = field(default_factory=EngineSection)
    sockets: SocketsConfig = field(default_factory=SocketsConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def validate(self) -> "EngineConfig":
        m, l, e = self.model, self.learning, self.engine
        from ..nn import STACKS
        if not m.factory and m.stack not in STACKS:
            raise ConfigError(f"model.stack = {m.stack!r}: choose one of {STACKS} or set model.factory")
        for name in ("n_in", "n_hidden", "n_out"):
            if getattr(m, name) < 1:
                raise ConfigError(f"model.{name} must be >= 1")
        if l.algorithm not in ("d-rtrl", "es-d-rtrl", "rtrl"):
            raise ConfigError(f"learning.algorithm = {l.algorithm!r}: choose d-rtrl, es-d-rtrl or rtrl")
        if l.mode not in ("forecast", "supervised"):
            raise ConfigError(f"learning.mode = {l.mode!r}: choose forecast or supervised")
        if l.optimizer not in OPTIMIZERS:
            raise ConfigError(f"learning.optimizer = {l.optimizer!r}: choose one of {sorted(OPTIMIZERS)}")
        if not l.lr > 0:
            raise ConfigError("learning.lr must be > 0")
        if e.slots < 1 or e.micro_batch < 1 or e.max_pending < 1:
            raise ConfigError("engine.slots, engine.micro_batch and engine.max_pending must be >= 1")
        if not e.park_s >= 0 or e.max_parked < 1:
            raise ConfigError("engine.park_s must be >= 0 and engine.max_parked >= 1")
        if e.on_gap not in ("reject", "accept"):
            raise ConfigError("engine.on_gap must be 'reject' or 'accept'")
        if self.checkpoint.dir and self.checkpoint.every < 1:
            raise ConfigError("checkpoint.every must be >= 1")
        return self

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


def _opt(name):
    import optax
    return {"adam": optax.adam, "sgd": optax.sgd, "rmsprop": optax.rmsprop, "adamw": optax.adamw}[name]


OPTIMIZERS = ("adam", "sgd", "rmsprop", "adamw")


def make_optimizer(cfg: LearningConfig):
    return _opt(cfg.optimizer)(cfg.lr)


def _fill(obj, data: dict, where: str):
    names = {f.name: f for f in fields(obj)}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"unknown key '{where}{key}'; known: {sorted(names)}")
        current = getattr(obj, key)
        if is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"'{where}{key}' must be a table")
            _fill(current, value, f"{where}{key}.")
            continue
        want = type(current)
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ConfigError(f"'{where}{key}' must be {want.__name__}; got {value!r}")
        setattr(obj, key, value)


def load_config(path: str | Path | None = None, overrides: dict | None = None) -> EngineConfig:
    cfg = EngineConfig()
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
        _fill(cfg, data, "")
    if overrides:
        _fill(cfg, overrides, "")
    return cfg.validate()


def build_model(cfg: ModelConfig):
    """The configured model: a built-in stack, or the user's ``module:function``."""
    from ..nn import Stack
    if cfg.factory:
        mod_name, _, fn_name = cfg.factory.partition(":")
        if not mod_name or not fn_name:
            raise ConfigError(f"model.factory = {cfg.factory!r}: write it as 'package.module:function'")
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"model.factory = {cfg.factory!r}: {e}") from None
        return fn()
    return Stack(cfg.stack, cfg.n_in, cfg.n_hidden, cfg.n_out, readout=cfg.readout or None, seed=cfg.seed)
