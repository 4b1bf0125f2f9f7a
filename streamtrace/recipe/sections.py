"""The sections of a learner's recipe: one dataclass per TOML table, every key with a default.

Each dataclass is what one ``[section]`` of a config file fills; ``recipe.Recipe`` holds them.

>>> LearningConfig().algorithm, ModelConfig().n_hidden
('d-rtrl', 32)
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["StreamConfig", "ModelConfig", "ReservoirConfig", "InputTransformConfig", "ReadoutConfig",
           "LearningConfig", "LearnedConfig", "CombineConfig", "ScreenConfig", "MetricsConfig"]


@dataclass
class StreamConfig:              # [stream]: what every stream served sends (recipe/quantities.py)
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
class InputTransformConfig:      # [transform]: the input transforms between the user's units and the
                                 # model (was [signal], still read with a warning)
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


@dataclass
class MetricsConfig:             # [metrics]: the learner's rolling prequential metrics
    window: int = 1000            # time constant in steps (not a MultiStepData window, nor
                                  # evaluate's scored tail)
