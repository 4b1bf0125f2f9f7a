"""A learner's recipe: the sections that describe one learner (model, reservoir, input
transforms, readout, learning, learned features, experts, screen, rolling metrics), checked on
their own and against each other. ``build.build_learner`` turns a recipe into an
``OnlineLearner``; the engine's config is a recipe plus the server's sections.

>>> r = Recipe(); r.model.n_in = 2; r.model.n_out = 2
>>> r.validate().model.n_in
2
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .checks import int_range, one_of, positive
from .errors import ConfigError
from .optimizers import OPTIMIZERS, change_detector
from .sections import (CombineConfig, InputTransformConfig, LearnedConfig, LearningConfig, MetricsConfig,
                       ModelConfig, ReadoutConfig, ReservoirConfig, ScreenConfig, StreamConfig)

__all__ = ["Recipe", "FEATURE_MODELS", "MAX_UNITS", "config_modes"]

MAX_UNITS = 1_000_000
# model.stack kinds that return their state as features for the readout (readout.kind = "rls")
FEATURE_MODELS = ("reservoir", "rotation")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass
class Recipe:
    """One learner's description, section by section (each a dataclass whose every key has a
    default); what a config file's learner tables fill.

    Parameters
    ----------
    stream, model, reservoir, transform, readout, learning, learned, combine, screen, metrics
        The sections (``recipe.sections``); each defaults to its dataclass's defaults.

    >>> Recipe().learning.mode
    'forecast'
    """
    stream: StreamConfig = field(default_factory=StreamConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    reservoir: ReservoirConfig = field(default_factory=ReservoirConfig)
    transform: InputTransformConfig = field(default_factory=InputTransformConfig)
    readout: ReadoutConfig = field(default_factory=ReadoutConfig)
    learning: LearningConfig = field(default_factory=LearningConfig)
    learned: LearnedConfig = field(default_factory=LearnedConfig)
    combine: CombineConfig = field(default_factory=CombineConfig)
    screen: ScreenConfig = field(default_factory=ScreenConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def validate(self):
        """Every learner value on its own and against the others, quantities (``"20 ms"``,
        ``"250 Hz"``) converted first; sections in a fixed order, so that with several bad values
        the first one found is named. Returns ``self``; raises ``ConfigError``."""
        self.validate_recipe()
        return self

    def validate_recipe(self):
        """The recipe's own checks (an engine config runs them before the server's)."""
        self._resolve_quantities()
        self._validate_model()
        self._validate_learning()
        self._validate_labels()
        self._validate_learned()
        self._validate_screen()

    @staticmethod
    def _resolve(cfg):
        from .quantities import resolve
        resolve(cfg)

    def _resolve_quantities(self):
        from ..units import UnitError
        try:
            self._resolve(self)
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
            int_range(f"model.{name}", getattr(m, name), 1, MAX_UNITS)
        if m.readout not in ("", "linear", "leaky"):
            raise ConfigError("model.readout", f"{m.readout!r}: choose 'linear' or 'leaky' (or leave it out)")
        int_range("model.seed", m.seed, 0, 2**32 - 1)
        if m.stack == "rotation" and not m.factory and m.n_hidden % 2:
            raise ConfigError("model.n_hidden", f"a rotation bank holds two states per rotation: must be even; "
                              f"got {m.n_hidden}")

    def _validate_learned(self):
        from ..nn.stacks import LEARNED_CELLS
        b, cells = self.learned, tuple(LEARNED_CELLS)
        if not b.stack:
            return
        if b.stack not in cells:
            raise ConfigError("learned.stack", f"{b.stack!r}: choose {one_of(cells)} (or leave it out)")
        if self.readout.kind != "rls":
            raise ConfigError("learned.stack", "learned features need a readout over them: set readout.kind = 'rls'")
        int_range("learned.n_hidden", b.n_hidden, 1, MAX_UNITS)
        if b.stack == "rotation" and b.n_hidden % 2:
            raise ConfigError("learned.n_hidden", f"a rotation bank holds two states per rotation: must be even; "
                              f"got {b.n_hidden}")
        if b.optimizer not in OPTIMIZERS:
            raise ConfigError("learned.optimizer", f"{b.optimizer!r}: choose one of {sorted(OPTIMIZERS)}")
        positive("learned.lr", b.lr)

    def _validate_learning(self):
        m, l = self.model, self.learning
        algorithms, modes = _algorithm_names(), config_modes()
        if l.algorithm not in algorithms:
            raise ConfigError("learning.algorithm", f"{l.algorithm!r}: choose {one_of(algorithms)}")
        if l.mode not in modes:
            raise ConfigError("learning.mode", f"{l.mode!r}: choose {one_of(modes)}")
        if l.optimizer not in OPTIMIZERS:
            raise ConfigError("learning.optimizer", f"{l.optimizer!r}: choose one of {sorted(OPTIMIZERS)}")
        positive("learning.lr", l.lr)
        if not (math.isfinite(l.clip) and l.clip >= 0):
            raise ConfigError("learning.clip", f"must be a gradient norm > 0 (or 0: no clipping); got {l.clip}")
        int_range("learning.learn_every", l.learn_every, 1, 1_000_000)
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
        int_range("learning.label_delay", l.label_delay, 0, MAX_LABEL_DELAY)
        if not l.label_delay:
            return
        if l.mode != "supervised":
            why = "learning.mode = 'supervised'"
        elif l.optimizer == "frozen" or l.learn_every != 1:
            why = "a model that learns (learning.optimizer not 'frozen') and learning.learn_every = 1"
        elif self.readout.kind or self.learned.stack or self.combine.experts:
            why = "no readout.kind, learned.stack or combine.experts"
        elif self.transform.normalise or self.transform.feedback or self.transform.residual:
            why = "no [transform] settings (normalise, feedback, residual)"
        if why:
            raise ConfigError("learning.label_delay", f"delayed labels need {why}")

    def _validate_screen(self):
        sc = self.screen
        if sc.policy not in ("skip", "clip", "off"):
            raise ConfigError("screen.policy", f"must be skip, clip or off; got {sc.policy!r}")
        positive("screen.threshold", sc.threshold)
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

    def _validate_learning_quality(self):
        m, r, sg, ro, l = self.model, self.reservoir, self.transform, self.readout, self.learning
        if not 0 < r.leak <= 1:
            raise ConfigError("reservoir.leak", f"must be in (0, 1]; got {r.leak}")
        if not 0 < r.density <= 1:
            raise ConfigError("reservoir.density", f"must be in (0, 1]; got {r.density}")
        for key in ("spectral_radius", "input_scaling", "bias_scaling"):
            v = getattr(r, key)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"reservoir.{key}", f"must be a finite number >= 0; got {v}")
        int_range("transform.normalise_warmup", sg.normalise_warmup, 1, 2**31 - 1)
        if not 0 <= sg.normalise_rate < 1:
            raise ConfigError("transform.normalise_rate", f"must be in [0, 1); got {sg.normalise_rate}")
        int_range("transform.feedback", sg.feedback, 0, 10_000, " (targets fed back; 0: off)")
        if sg.feedback and l.mode != "supervised":
            raise ConfigError("transform.feedback", "feeds supervised targets back as inputs: needs learning.mode = "
                              "'supervised' (a forecast's input already is its last target)")
        if sg.residual and l.mode != "forecast":
            raise ConfigError("transform.residual", "predicts the change of a forecast: needs learning.mode = 'forecast'")
        if ro.kind not in ("", "rls"):
            raise ConfigError("readout.kind", f"{ro.kind!r}: choose 'rls' (or leave it out)")
        if not 0 < ro.lam <= 1:
            raise ConfigError("readout.lam", f"must be in (0, 1]; got {ro.lam}")
        if not ro.delta or not all(isinstance(d, (int, float)) and not isinstance(d, bool) for d in ro.delta):
            raise ConfigError("readout.delta", f"must be a number or a list of numbers; got {ro.delta!r}")
        for d in ro.delta:
            positive("readout.delta", d)
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
        int_range("learning.horizon", l.horizon, 1, 10_000)
        if l.horizon > 1 and l.mode != "forecast":
            raise ConfigError("learning.horizon", "needs learning.mode = 'forecast'")
        if l.forecast_before_update and l.mode != "forecast":
            raise ConfigError("learning.forecast_before_update", "is a forecast option (a supervised prediction is "
                              "always made before the update); needs learning.mode = 'forecast'")
        int_range("metrics.window", self.metrics.window, 1, 2**31 - 1)
        c = self.combine
        if c.period == 1 or not 0 <= c.period <= 10_000_000:
            raise ConfigError("combine.period", f"must be a period of >= 2 samples (or 0: none); got {c.period}")
        if c.max_period == 1 or not 0 <= c.max_period <= 100_000:
            raise ConfigError("combine.max_period", f"must be in 2..100000 samples (or 0: no detection); "
                              f"got {c.max_period}")
        if c.period and c.max_period:
            raise ConfigError("combine.max_period", "give combine.period (known) or combine.max_period "
                              "(detect it), not both")
        positive("combine.eta", c.eta)
        int_range("combine.window", c.window, 1, 2**31 - 1)


def _algorithm_names() -> tuple:
    from ..learner.algorithms import ALGORITHMS     # the learner owns the names
    return ALGORITHMS


def config_modes() -> tuple:
    """The learner's modes a served model can be in: "predict" (never learn) is a per-message
    choice on the wire, not a setting.

    >>> config_modes()
    ('forecast', 'supervised')
    """
    from ..learner.step import MODES
    return tuple(sorted(m for m in MODES if m != "predict"))
