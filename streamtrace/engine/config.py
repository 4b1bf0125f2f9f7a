"""Engine configuration: a TOML file whose every key has a default that just works."""
from __future__ import annotations

import ipaddress
import math
import re
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from urllib.parse import urlparse

from .quantities import QUANTITY_KEYS

__all__ = ["EngineConfig", "load_config", "ConfigError", "stream_section"]


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type, or inconsistent.

    ``ConfigError("section.key", "what is wrong")`` reads ``section.key: what is wrong``, the
    one line ``streamtrace serve`` prints; ``key`` names the blamed setting."""

    def __init__(self, key: str, problem: str | None = None):
        self.key = key if problem is not None else ""
        super().__init__(key if problem is None else f"{key}: {problem}")


@dataclass
class StreamConfig:              # [stream]: what every stream served sends (engine/quantities.py)
    rate: float = 0.0            # samples per second, a number or "250 Hz" (0: not declared); converts
                                 # the durations other keys are given in ("20 ms") into steps
    units: list = field(default_factory=list)   # one unit per input channel ("V", "mV", "": none;
                                 # []: not declared): the unit of ranges written as quantities


@dataclass
class ModelConfig:
    stack: str = "gru"           # a built-in stack (streamtrace.nn.STACKS) ...
    factory: str = ""            # ... or "package.module:function" returning a brainstate module
    n_in: int = 1
    n_hidden: int = 32
    n_out: int = 1
    readout: str = ""            # "", "linear" or "leaky"
    seed: int = 0
    precision: int = 32          # 32 or 64 (float64: what an exact RLS readout needs to shine)


@dataclass
class ReservoirConfig:           # model.stack = "reservoir": n_hidden leaky tanh units
    leak: float = 1.0
    spectral_radius: float = 0.9
    input_scaling: float = 0.3
    bias_scaling: float = 0.5
    density: float = 0.1


@dataclass
class InputTransformConfig:      # [signal]: the input transforms between the user's units and the model
                                 # (not a learning signal: those are etrace.signals hooks)
    normalise: bool = False      # causal per-channel standardisation (learning waits for warm-up)
    normalise_warmup: int = 100
    normalise_rate: float = 0.0  # after warm-up: 0 = frozen statistics, else an exponential rate
    residual: bool = False       # forecast: predict the change from the last value
    feedback: int = 0            # supervised: the targets of the last N steps are inputs too (0: off)


@dataclass
class ReadoutConfig:             # a closed-form readout over the model's output features
    kind: str = ""               # "" (the model's own output is the prediction) or "rls"
    lam: float = 1.0             # forgetting factor (1: remember everything)
    # P starts at I / delta (smaller: less ridge); several values: each step predicts with the
    # readout whose recent prequential error is lowest (strong ridge for short streams)
    delta: list = field(default_factory=lambda: [0.1, 1e-8])
    use_input: bool = True       # the (encoded) input is a readout feature too
    # forget faster after a detected change (learner/adaptive_forgetting.py): when the readout's
    # recent error (change_fast steps) exceeds change_threshold times its longer-run level
    # (change_slow steps), forget with change_lam for change_hold steps (1.0: never; the default
    # learner: 0.99). A stream that never fires it gets the plain readout, bit for bit.
    change_lam: float = 1.0
    change_threshold: float = 3.5
    change_hold: int = 1000
    change_fast: int = 50
    change_slow: int = 500


@dataclass
class LearningConfig:
    algorithm: str = "d-rtrl"    # d-rtrl, es-d-rtrl, rtrl
    decay: float = 0.0           # es-d-rtrl trace decay (0 = use rank or the default 0.9)
    rank: float = 0.0
    mode: str = "forecast"       # forecast (target = next input) or supervised
    optimizer: str = "adam"      # adam, sgd, rmsprop, adamw, or frozen (the weights never move)
    lr: float = 1e-3
    clip: float = 0.0            # global-norm gradient clipping; 0 = off
    learn_every: int = 1
    channels: list = field(default_factory=list)   # forecast: the input channels to predict ([]: all)
    horizon: int = 1             # forecast: predict the next `horizon` values every step
    label_delay: int = 0         # supervised: the `label` of seq t may come until data seq t + label_delay
                                 # (after at most label_delay - 1 later data messages)
    forecast_before_update: bool = False   # forecast: predict with the weights as they were before
                                 # this step's update, so the reply can leave before it runs
                                 # (engine.reply_first; its quality cost: docs/configuration.md)


@dataclass
class LearnedConfig:             # trace-learned features beside the model's, under its readout
    stack: str = ""              # "" (none) or a recurrent cell: "gru", "lstm", "rnn" (nn.Beside)
    n_hidden: int = 16
    # the cell's optimizer (the model's own weights follow learning.*): plain SGD, whose step
    # shrinks with the gradient; Adam's normalised step moved the features through noise where
    # the readout had nothing for them and made Mackey-Glass and NARMA-10 worse (docs/quality.md)
    optimizer: str = "sgd"
    lr: float = 3e-3


@dataclass
class CombineConfig:             # what the user gets: the model's forecast mixed with simple experts
    experts: bool = False        # on in the default learner; an online mixture of the model with
                                 # persistence, a running mean (and a seasonal naive forecast) by
                                 # their recent losses, per stream and channel (learner/experts.py)
    period: int = 0              # the seasonal naive expert's period in samples (0: none)
    max_period: int = 0          # or detect it online, one or two seasons in 2..max_period-1 (0: off;
                                 # learner/period.py); with a period a linear expert joins (lagged_rls.py)
    eta: float = 8.0             # how fast the weights follow the losses (per std-unit squared error)
    window: int = 500            # the losses' memory (forgetting 1 - 1/window) and the mean's window


@dataclass
class ScreenConfig:              # outlier screening of every input channel (learner/screen.py)
    policy: str = "skip"         # skip (the step sees the last good value and learns nothing), clip, or off
    threshold: float = 30.0      # running mean absolute deviations from the running location
    rate: float = 0.01           # the running statistics' rate (time constant 1 / rate steps)
    # hard limits in the stream's units: [lo, hi] for every channel, or [[lo, hi], ...] one pair per
    # channel ([]: none); a value outside is always an outlier
    range: list = field(default_factory=list)


# The default learner: what `serve`, `demo`, `replay --serve`, the bridges and `evaluate` run when
# the config names no model (neither model.stack nor model.factory). Any of these keys the config
# does set wins. A fixed 200-unit float64 reservoir beside a GRU-16 whose weights learn through
# D-RTRL traces (SGD) from the readout's error, causal standardisation, forecasts of the change
# from the last value (forecast mode), an exact RLS readout over both choosing between two
# ridges and forgetting faster for a while after a detected change in its error (change_lam),
# mixed with persistence and a running mean. The learned GRU made every task as good or
# better than the reservoir alone, for ~1.2x its step (docs/quality.md); `[learned] stack = ""`
# turns it off.
DEFAULT_LEARNER = {
    "model": {"stack": "reservoir", "n_hidden": 200, "precision": 64},
    "signal": {"normalise": True, "normalise_rate": 0.003, "residual": "forecast"},  # residual: forecasts only
    "readout": {"kind": "rls", "change_lam": 0.99},
    "learned": {"stack": "gru", "n_hidden": 16},
    "learning": {"optimizer": "frozen"},
    "combine": {"experts": True},
}


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
class MetricsConfig:
    prometheus_port: int = 0      # 0 = off; served on 127.0.0.1
    prometheus_addr: str = "127.0.0.1"
    window: int = 1000            # rolling prequential metrics: time constant in steps (not a
                                  # MultiStepData window, nor evaluate's scored tail)


@dataclass
class EngineConfig:
    stream: StreamConfig = field(default_factory=StreamConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    reservoir: ReservoirConfig = field(default_factory=ReservoirConfig)
    signal: InputTransformConfig = field(default_factory=InputTransformConfig)
    readout: ReadoutConfig = field(default_factory=ReadoutConfig)
    learning: LearningConfig = field(default_factory=LearningConfig)
    learned: LearnedConfig = field(default_factory=LearnedConfig)
    combine: CombineConfig = field(default_factory=CombineConfig)
    screen: ScreenConfig = field(default_factory=ScreenConfig)
    engine: EngineSection = field(default_factory=EngineSection)
    sockets: SocketsConfig = field(default_factory=SocketsConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    # [bridge.lsl], [bridge.mqtt]: read and checked by the bridges (streamtrace.adapters), not the engine
    bridge: dict = field(default_factory=dict)

    def validate(self) -> "EngineConfig":
        """Every value on its own and against the others; what needs the machine (files,
        ports, CPUs, the factory's module) is checked by ``engine.preflight``. Sections in a
        fixed order: with several bad values, the first one found is the one named. Quantities
        (``"20 ms"``, ``"250 Hz"``) are converted first (``engine.quantities``)."""
        self._resolve_quantities()
        self._validate_model()
        self._validate_learning()
        self._validate_labels()
        self._validate_learned()
        self._validate_screen()
        self._validate_engine()
        self._validate_outputs()
        self._validate_security()
        self._validate_metrics()
        return self

    def _resolve_quantities(self):
        from ..units import UnitError
        from .quantities import resolve
        try:
            resolve(self)
        except UnitError as e:
            raise ConfigError(e.key, e.problem) from None
        n = len(self.stream.units)
        if n and n != self.model.n_in:
            raise ConfigError("stream.units", f"gives {n} units for model.n_in = {self.model.n_in} input "
                              "channels: one per channel (\"\" for one without a unit)")

    def _validate_model(self):
        m = self.model
        from ..nn import STACKS
        if m.factory:
            if not _FACTORY.match(m.factory):
                raise ConfigError("model.factory", f"{m.factory!r}: write it as 'package.module:function'")
        elif m.stack not in STACKS + FEATURE_MODELS:
            raise ConfigError("model.stack", f"{m.stack!r}: choose one of {STACKS + FEATURE_MODELS} "
                              "or set model.factory")
        if m.precision not in (32, 64):
            raise ConfigError("model.precision", f"must be 32 or 64; got {m.precision}")
        self._validate_learning_quality()
        for name in ("n_in", "n_hidden", "n_out"):
            _int_range(f"model.{name}", getattr(m, name), 1, MAX_UNITS)
        if m.readout not in ("", "linear", "leaky"):
            raise ConfigError("model.readout", f"{m.readout!r}: choose 'linear' or 'leaky' (or leave it out)")
        _int_range("model.seed", m.seed, 0, 2**32 - 1)
        if m.stack == "rotation" and not m.factory and m.n_hidden % 2:
            raise ConfigError("model.n_hidden", f"a rotation bank holds two states per rotation: must be even; "
                              f"got {m.n_hidden}")

    def _validate_learned(self):
        from ..nn.stacks import LEARNED_CELLS
        b, cells = self.learned, tuple(LEARNED_CELLS)
        if not b.stack:
            return
        if b.stack not in cells:
            raise ConfigError("learned.stack", f"{b.stack!r}: choose {_one_of(cells)} (or leave it out)")
        if self.readout.kind != "rls":
            raise ConfigError("learned.stack", "learned features need a readout over them: set readout.kind = 'rls'")
        _int_range("learned.n_hidden", b.n_hidden, 1, MAX_UNITS)
        if b.stack == "rotation" and b.n_hidden % 2:
            raise ConfigError("learned.n_hidden", f"a rotation bank holds two states per rotation: must be even; "
                              f"got {b.n_hidden}")
        if b.optimizer not in OPTIMIZERS:
            raise ConfigError("learned.optimizer", f"{b.optimizer!r}: choose one of {sorted(OPTIMIZERS)}")
        _positive("learned.lr", b.lr)

    def _validate_learning(self):
        m, l = self.model, self.learning
        algorithms, modes = _algorithm_names(), config_modes()
        if l.algorithm not in algorithms:
            raise ConfigError("learning.algorithm", f"{l.algorithm!r}: choose {_one_of(algorithms)}")
        if l.mode not in modes:
            raise ConfigError("learning.mode", f"{l.mode!r}: choose {_one_of(modes)}")
        if l.optimizer not in OPTIMIZERS:
            raise ConfigError("learning.optimizer", f"{l.optimizer!r}: choose one of {sorted(OPTIMIZERS)}")
        _positive("learning.lr", l.lr)
        if not (math.isfinite(l.clip) and l.clip >= 0):
            raise ConfigError("learning.clip", f"must be a gradient norm > 0 (or 0: no clipping); got {l.clip}")
        _int_range("learning.learn_every", l.learn_every, 1, 1_000_000)
        if not (0 <= l.decay < 1):
            raise ConfigError("learning.decay", f"must be in [0, 1) (0: the default 0.9); got {l.decay}")
        if not (l.rank == 0 or (math.isfinite(l.rank) and l.rank >= 1)):
            raise ConfigError("learning.rank", f"must be >= 1 (or 0: use decay); got {l.rank}")
        for name in ("decay", "rank"):
            if getattr(l, name) and l.algorithm != "es-d-rtrl":
                raise ConfigError(f"learning.{name}", f"only es-d-rtrl has a trace decay; "
                                  f"learning.algorithm is {l.algorithm!r}")
        if l.decay and l.rank:
            raise ConfigError("learning.rank", "give learning.decay or learning.rank, not both")
        n_pred = len(l.channels) if l.channels else m.n_in
        if l.mode == "forecast" and not m.factory and m.n_out != n_pred:
            what = f"len(learning.channels) = {n_pred}" if l.channels else f"model.n_in = {m.n_in}"
            raise ConfigError("model.n_out", f"forecast mode predicts the next input, so it must equal "
                              f"{what}; got {m.n_out} (or use learning.mode = 'supervised')")

    def _validate_labels(self):
        """learning.label_delay: what the label ring supports (learner/labels.py)."""
        l, why = self.learning, None
        from ..learner.modes import MAX_LABEL_DELAY
        _int_range("learning.label_delay", l.label_delay, 0, MAX_LABEL_DELAY)
        if not l.label_delay:
            return
        if l.mode != "supervised":
            why = "learning.mode = 'supervised'"
        elif l.optimizer == "frozen" or l.learn_every != 1:
            why = "a model that learns (learning.optimizer not 'frozen') and learning.learn_every = 1"
        elif self.readout.kind or self.learned.stack or self.combine.experts:
            why = "no readout.kind, learned.stack or combine.experts"
        elif self.signal.normalise or self.signal.feedback or self.signal.residual:
            why = "no [signal] transforms (normalise, feedback, residual)"
        if why:
            raise ConfigError("learning.label_delay", f"delayed labels need {why}")

    def _validate_engine(self):
        m, e = self.model, self.engine
        _int_range("engine.slots", e.slots, 1, 1_000_000)
        _int_range("engine.micro_batch", e.micro_batch, 1, 4096)
        _int_range("engine.max_pending", e.max_pending, 1, 10_000_000)
        if not (math.isfinite(e.park_s) and e.park_s >= 0):
            raise ConfigError("engine.park_s", f"must be >= 0 seconds (0: off); got {e.park_s}")
        _int_range("engine.max_parked", e.max_parked, 1, 1_000_000)
        if not e.idle_timeout_s >= 0:    # inf is fine: streams are never evicted
            raise ConfigError("engine.idle_timeout_s", f"must be >= 0 seconds; got {e.idle_timeout_s}")
        smallest = 512 + 8 * (m.n_in + m.n_out)
        _int_range("engine.max_message_bytes", e.max_message_bytes, smallest, 1 << 30,
                   f" (a data message of n_in + n_out float64 values and a 128-character stream name "
                   f"needs up to ~{smallest} bytes)")
        _int_range("engine.cpu", e.cpu, -1, 1 << 20, " (-1: no pinning)")
        _int_range("engine.busy_poll_us", e.busy_poll_us, 0, 1_000_000, " (0: off)")
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
        _int_range("sockets.hwm", self.sockets.hwm, 0, 2**31 - 1, " (0: no limit)")
        _int_range("publish.weights_every", self.publish.weights_every, 0, 2**62, " (0: never)")
        _positive("publish.stats_every_s", self.publish.stats_every_s)
        _int_range("checkpoint.every", self.checkpoint.every, 1, 2**62)
        _int_range("checkpoint.keep", self.checkpoint.keep, 1, 1_000_000)

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

    def _validate_screen(self):
        sc = self.screen
        if sc.policy not in ("skip", "clip", "off"):
            raise ConfigError("screen.policy", f"must be skip, clip or off; got {sc.policy!r}")
        _positive("screen.threshold", sc.threshold)
        if not 0 < sc.rate <= 1:
            raise ConfigError("screen.rate", f"must be in (0, 1]; got {sc.rate!r}")
        if sc.range:
            pairs = sc.range if isinstance(sc.range[0], list) else [sc.range]
            if any(not isinstance(p, list) or len(p) != 2 or
                   not all(isinstance(v, (int, float)) and math.isfinite(v) for v in p) or p[0] >= p[1]
                   for p in pairs):
                raise ConfigError("screen.range", f"must be [lo, hi] with lo < hi, or one such pair per input "
                                  f"channel; got {sc.range!r}")
            if len(pairs) not in (1, self.model.n_in):
                raise ConfigError("screen.range", f"{len(pairs)} pairs for model.n_in = {self.model.n_in} "
                                  "input channels (give one pair, or one per channel)")

    def _validate_metrics(self):
        _int_range("metrics.prometheus_port", self.metrics.prometheus_port, 0, 65535, " (0: off)")
        if self.metrics.prometheus_port and not self.metrics.prometheus_addr:
            raise ConfigError("metrics.prometheus_addr", "required with metrics.prometheus_port")

    def _validate_learning_quality(self):
        m, r, sg, ro, l = self.model, self.reservoir, self.signal, self.readout, self.learning
        if not 0 < r.leak <= 1:
            raise ConfigError("reservoir.leak", f"must be in (0, 1]; got {r.leak}")
        if not 0 < r.density <= 1:
            raise ConfigError("reservoir.density", f"must be in (0, 1]; got {r.density}")
        for key in ("spectral_radius", "input_scaling", "bias_scaling"):
            v = getattr(r, key)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"reservoir.{key}", f"must be a finite number >= 0; got {v}")
        _int_range("signal.normalise_warmup", sg.normalise_warmup, 1, 2**31 - 1)
        if not 0 <= sg.normalise_rate < 1:
            raise ConfigError("signal.normalise_rate", f"must be in [0, 1); got {sg.normalise_rate}")
        _int_range("signal.feedback", sg.feedback, 0, 10_000, " (targets fed back; 0: off)")
        if sg.feedback and l.mode != "supervised":
            raise ConfigError("signal.feedback", "feeds supervised targets back as inputs: needs learning.mode = "
                              "'supervised' (a forecast's input already is its last target)")
        if sg.residual and l.mode != "forecast":
            raise ConfigError("signal.residual", "predicts the change of a forecast: needs learning.mode = 'forecast'")
        if ro.kind not in ("", "rls"):
            raise ConfigError("readout.kind", f"{ro.kind!r}: choose 'rls' (or leave it out)")
        if not 0 < ro.lam <= 1:
            raise ConfigError("readout.lam", f"must be in (0, 1]; got {ro.lam}")
        if not ro.delta or not all(isinstance(d, (int, float)) and not isinstance(d, bool) for d in ro.delta):
            raise ConfigError("readout.delta", f"must be a number or a list of numbers; got {ro.delta!r}")
        for d in ro.delta:
            _positive("readout.delta", d)
        change_detector(ro)
        if m.stack in FEATURE_MODELS and not m.factory and ro.kind != "rls":
            raise ConfigError("readout.kind", f"model.stack = {m.stack!r} returns its state: it needs readout.kind = 'rls'")
        if l.channels:
            if not all(isinstance(c, int) and not isinstance(c, bool) for c in l.channels):
                raise ConfigError("learning.channels", f"must be a list of input channel indices; got {l.channels!r}")
            if len(set(l.channels)) != len(l.channels) or min(l.channels) < 0 or max(l.channels) >= m.n_in:
                raise ConfigError("learning.channels", f"must be distinct indices in 0..{m.n_in - 1}; got {l.channels}")
            if l.mode != "forecast":
                raise ConfigError("learning.channels", "chooses what a forecast predicts: needs learning.mode = 'forecast'")
        _int_range("learning.horizon", l.horizon, 1, 10_000)
        if l.horizon > 1 and l.mode != "forecast":
            raise ConfigError("learning.horizon", "needs learning.mode = 'forecast'")
        if l.forecast_before_update and l.mode != "forecast":
            raise ConfigError("learning.forecast_before_update", "is a forecast option (a supervised prediction is "
                              "always made before the update); needs learning.mode = 'forecast'")
        _int_range("metrics.window", self.metrics.window, 1, 2**31 - 1)
        c = self.combine
        if c.period == 1 or not 0 <= c.period <= 10_000_000:
            raise ConfigError("combine.period", f"must be a period of >= 2 samples (or 0: none); got {c.period}")
        if c.max_period == 1 or not 0 <= c.max_period <= 100_000:
            raise ConfigError("combine.max_period", f"must be in 2..100000 samples (or 0: no detection); "
                              f"got {c.max_period}")
        if c.period and c.max_period:
            raise ConfigError("combine.max_period", "give combine.period (known) or combine.max_period "
                              "(detect it), not both")
        _positive("combine.eta", c.eta)
        _int_range("combine.window", c.window, 1, 2**31 - 1)

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


MAX_UNITS = 1_000_000
# model.stack kinds that return their state as features for the readout (readout.kind = "rls")
FEATURE_MODELS = ("reservoir", "rotation")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_SCHEMES = ("tcp", "ipc", "inproc")


def change_detector(ro: ReadoutConfig):
    """The readout's change detector for ``[readout] change_*``; a bad value is a ConfigError."""
    from ..learner.adaptive_forgetting import ChangeDetector, SettingError
    try:
        return ChangeDetector(ro.change_lam, threshold=ro.change_threshold, hold=ro.change_hold,
                              fast=ro.change_fast, slow=ro.change_slow)
    except SettingError as e:
        raise ConfigError(f"readout.{e.key}", e.problem) from None


def _int_range(key, v, lo, hi, note=""):
    if not lo <= v <= hi:
        raise ConfigError(key, f"must be in {lo}..{hi}{note}; got {v}")


def _positive(key, v):
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(key, f"must be a finite number > 0; got {v}")


def _check_address(key, addr):
    scheme, sep, rest = addr.partition("://")
    if not sep or scheme not in _SCHEMES or not rest:
        raise ConfigError(key, f"{addr!r} is not a ZeroMQ address: write e.g. 'tcp://127.0.0.1:5555' "
                          f"or 'ipc:///tmp/streamtrace.sock' (schemes: {', '.join(_SCHEMES)})")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host or not (port == "*" or (port.isdigit() and int(port) <= 65535)):
            raise ConfigError(key, f"{addr!r}: a tcp address is 'tcp://<host or interface>:<port 0..65535 or *>'")


def _opt(name):
    import optax

    from ..learner.adam import adam     # optax.adam, applied in place by the learner
    return {"adam": adam, "sgd": optax.sgd, "rmsprop": optax.rmsprop, "adamw": optax.adamw}[name]


OPTIMIZERS = ("adam", "sgd", "rmsprop", "adamw", "frozen")


def _algorithm_names() -> tuple:
    from ..learner.algorithms import ALGORITHMS     # the learner owns the names
    return ALGORITHMS


def config_modes() -> tuple:
    """The learner's modes a served model can be in: "predict" (never learn) is a per-message
    choice on the wire, not an engine setting."""
    from ..learner.step import MODES
    return tuple(sorted(m for m in MODES if m != "predict"))


def _one_of(names) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def make_optimizer(cfg: LearningConfig):
    """The learner's optimizer for ``[learning]``: optimizer at lr, behind a global-norm clip."""
    import optax

    from ..learner.optimizers import frozen
    if cfg.optimizer == "frozen":
        return frozen()
    opt = _opt(cfg.optimizer)(cfg.lr)
    return optax.chain(optax.clip_by_global_norm(cfg.clip), opt) if cfg.clip else opt


def _fill(obj, data: dict, where: str):
    names = {f.name: f for f in fields(obj)}
    for key, value in data.items():
        if key not in names:
            what = "section" if not where else "key"
            raise ConfigError(f"{where}{key}", f"unknown {what}; known: {', '.join(sorted(names))}")
        current = getattr(obj, key)
        if is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}{key}", f"must be a table ([{where}{key}]); got {value!r}")
            _fill(current, value, f"{where}{key}.")
            continue
        want = type(current)
        if isinstance(value, str) and want in (int, float) and f"{where}{key}" in QUANTITY_KEYS:
            setattr(obj, key, value)     # a quantity ("20 ms"): converted by validate()
            continue
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if want is list and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]      # one value where a list of them is allowed (readout.delta)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            kind = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}
            raise ConfigError(f"{where}{key}", f"must be {kind.get(want.__name__, want.__name__)}; got {value!r}")
        setattr(obj, key, value)


def read_toml(path: str | Path) -> dict:
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError("--config", f"file {path} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("--config", f"cannot read {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", f"{path}: invalid TOML: {e}") from None


def fill_section(obj, data: dict, where: str):
    """Set the fields of dataclass ``obj`` from ``data``, refusing unknown keys and wrong types
    as ``ConfigError`` naming ``where``+key (for sections other modules own, e.g. bridges)."""
    if not isinstance(data, dict):
        raise ConfigError(where.rstrip("."), f"must be a table ([{where.rstrip('.')}]); got {data!r}")
    _fill(obj, data, where)
    return obj


def stream_section(data: dict) -> StreamConfig:
    """``[stream]`` of a parsed TOML ``data`` (absent: nothing declared), its rate in hertz and its
    units checked; a bad value is a ``ConfigError`` naming the key. What the bridges read of the
    serve config (the engine reads it with the rest, in ``load_config``).

    >>> stream_section({"stream": {"rate": "2 kHz", "units": ["mV"]}})
    StreamConfig(rate=2000.0, units=['mV'])
    """
    from ..units import UnitError
    from .quantities import resolve_stream
    stream = fill_section(StreamConfig(), data.get("stream", {}), "stream.")
    try:
        return resolve_stream(stream)
    except UnitError as e:
        raise ConfigError(e.key, e.problem) from None


def load_config(path: str | Path | None = None, overrides: dict | None = None) -> EngineConfig:
    cfg = EngineConfig()
    given = set()
    for data in ((read_toml(path) if path else None), overrides):
        if data:
            _fill(cfg, data, "")
            given |= {f"{sec}.{k}" for sec, v in data.items() if isinstance(v, dict) for k in v}
    if not {"model.stack", "model.factory"} & given:
        _default_learner(cfg, given)
    return cfg.validate()


def _default_learner(cfg: EngineConfig, given: set):
    """Fill ``DEFAULT_LEARNER`` into the keys the config left out."""
    for section, values in DEFAULT_LEARNER.items():
        for key, value in values.items():
            if f"{section}.{key}" not in given:
                if value == "forecast":
                    value = cfg.learning.mode == "forecast"
                setattr(getattr(cfg, section), key, value)

