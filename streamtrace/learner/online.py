"""OnlineLearner: a model, an eligibility-trace algorithm, a loss and an optax optimizer,
compiled into one step function whose state crosses the call as a few packed buffers."""
from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from .adam import adam
from .algorithms import make_algorithm
from .describe import describe_model, describe_optimizer
from .groups import frozen_params
from .losses import get_loss
from .labels import LabelledSteps, LabelResult, checked_label, label_outcome
from .lead_experts import over_leads
from .modes import Supervised, mode_parts
from .named_state import NamedState
from .old_keywords import frozen_string, translate
from .optimizers import optimizer_parts
from .packing import Layout, path_name
from .programs import PAIR, Programs
from .result import StepResult
from .saving import Saving
from . import rollback
from .screen import Screened, screen_in
from .slot_access import SlotAccess
from .shapes import CallChecks, forecast_channels, model_input, prediction_shape
from .settings import CompileSettings, Metrics, Slots
from .step import StepConfig, StepFunctions

__all__ = ["OnlineLearner", "StepResult"]


def _value(given, cls, name):
    """A settings value: ``given``, or ``cls()`` for None."""
    if given is None:
        return cls()
    if not isinstance(given, cls):
        raise TypeError(f"{name} must be st.{cls.__name__}(...); got {given!r}")
    return given


class OnlineLearner(SlotAccess, Saving):
    """Online learning, one step per call: predict, then learn from the target.

    A model (``st.nn``), an eligibility-trace algorithm, a loss and an optax optimizer,
    compiled into one step function. Each ``step`` predicts from the newest sample and learns
    from its target (or, in forecast mode, from the sample itself as the target of the last
    prediction), so a stream is learnt as it arrives, with no replay and no batches. Use it for
    real-time signals; ``slots`` runs many independent streams in the same call.

    Parameters
    ----------
    model : brainstate.nn.Module
        The network, stepped once per sample (e.g. ``st.nn.Stack("gru", n_in, n_hidden,
        n_out)``); it returns one array, the prediction (or, with a ``readout``, features).
    example_x : array_like
        One sample's input (its shape and dtype are those of every later ``x``; without slots).
    algorithm : Algorithm or str, default "d-rtrl"
        ``d_rtrl()``, ``es_d_rtrl(decay=0.9, rank=None, signal=None)``, ``rtrl()``, one of
        their names, or a factory ``(model, example_x) -> algorithm``.
    loss : str or callable, default "mse"
        A name from ``streamtrace.learner.LOSSES`` or a function ``(prediction, target)``.
    optimizer : optax.GradientTransformation, optional
        Default ``adam(1e-3)`` (optax's Adam, applied in place). Also
        ``optax.chain(optax.clip_by_global_norm(c), adam(lr))``, ``param_groups(...)``
        (settings per named group of weights) or ``frozen()`` (the weights never move).
    mode : str, Supervised or Forecast, default "supervised"
        "supervised" (a target with every x), "forecast" (x_t is the target of the prediction
        made at t-1: learn from it, then predict x_{t+1}), "predict" (no learning; the state
        still advances), or ``Supervised(...)`` / ``Forecast(...)`` for their options.
    slots : int or Slots, optional
        N independent streams in one call, each with its own hidden state and traces
        (``Slots(N, shared=False)``: a model each). None: one stream, no slot axis.
    transform : Transform, optional
        The signal between the user's units and the model: ``chain(screen(), normalise(),
        residual())`` and their parts, ``feedback()``.
    readout : RLSReadout, optional
        ``rls()``: a closed-form readout over the model's output features.
    combine : Experts, optional
        ``experts()``: mix the prediction with persistence, a running mean and a seasonal
        naive forecast, weighted by their recent losses.
    compile : CompileSettings, optional
        ``CompileSettings(donate, standalone, batch_size)``: how the state crosses the
        compiled call (below).
    metrics : Metrics, optional
        ``Metrics(window)``: the rolling prequential MSE / MAE / NRMSE of ``stats()["metrics"]``.
    **old
        The keywords before these values (decay, lr, clip, learn_every, shared_weights, ...)
        still work for one release, with a DeprecationWarning naming the new form.

    Notes
    -----
    Non-finite inputs/losses/gradients never reach the weights: the step is skipped for that
    slot and counted (``stats()``). A step that leaves any non-finite value in the state is
    undone, bit for bit, and counted (``stats()["rolled_back"]``, ``StepResult.rolled_back``;
    learner/rollback.py). The engine's compiled programs are ``learner.programs``.

    The state crosses the compiled call as a few buffers: small leaves packed per dtype, leaves
    of at least ``standalone`` elements (weights, moments, traces) as buffers of their own.
    ``donate=True`` lets XLA reuse the standalone input buffers. Default: on with a readout (it
    saves a copy of the RLS matrix and of frozen weights every step), with slots and with an
    optimizer that updates in place (``adam``, the default); a plain learner with ``optax.adam``
    keeps its inputs (XLA would have to copy its guarded moments). Each was faster where it is
    on; the timings: docs/decisions/step-details.md.

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    >>> learner = st.OnlineLearner(model, np.zeros(1, np.float32), algorithm=st.d_rtrl(),
    ...                            optimizer=st.adam(1e-2), mode="forecast")
    >>> for t in range(5):
    ...     result = learner.step(np.array([np.sin(0.3 * t)], np.float32))
    >>> result.prediction.shape, learner.stats()["step"]
    ((1,), 5)
    """

    def __init__(self, model, example_x, *, algorithm="d-rtrl", loss="mse", optimizer=None, mode="supervised",
                 slots=None, transform=None, readout=None, combine=None, compile=None, metrics=None, **old):
        optimizer = frozen_string(optimizer)
        extra = {}
        if old:
            algorithm, optimizer, mode, slots, compile, metrics, extra = translate(
                old, algorithm, optimizer, mode, slots, compile, metrics)
        compile, metrics = _value(compile, CompileSettings, "compile"), _value(metrics, Metrics, "metrics")
        parts = optimizer_parts(adam() if optimizer is None else optimizer)
        screen, transform = screen_in(transform)
        self.label_delay = mode.label_delay if isinstance(mode, Supervised) else 0
        if self.label_delay and (transform, readout, combine) != (None, None, None) or self.label_delay and parts.frozen:
            raise ValueError("Supervised(label_delay=...) needs a model that learns (not frozen()), without "
                             "transform, readout or combine")
        mode, spec, learn_every = mode_parts(mode)
        learn_every = extra.get("learn_every", learn_every)
        slots = Slots(slots) if slots is not None and not isinstance(slots, Slots) else slots
        example_x = np.asarray(example_x)
        brainstate.nn.init_all_states(model, compile.batch_size)
        self.model = model
        self.algo = make_algorithm(algorithm, model, jnp.asarray(model_input(example_x, transform, readout)),
                                   fixed=frozen_params(model, parts.groups))
        out = self.algo.graph.out_struct
        if not hasattr(out, "shape"):
            raise ValueError("the model must return one array (the prediction)")
        self.x_shape, self.x_dtype = tuple(example_x.shape), example_x.dtype
        channels = forecast_channels(spec, self.x_shape)
        self.out_shape, self.y_dtype = prediction_shape(out, readout, mode, channels, self.x_shape)
        reduce = slots.reduce if slots is not None else extra.get("reduce", "mean")
        self.cfg = StepConfig(mode, learn_every, reduce, channels, spec.horizon if spec else 1, metrics.window,
                              self.label_delay, before_update=bool(spec and spec.before_update))
        steps = LabelledSteps if self.label_delay else StepFunctions
        combine = over_leads(combine, self.cfg.horizon)     # a horizon: the experts mix every lead
        fns = steps(self.algo, get_loss(loss), parts, self.cfg, transform=transform, readout=readout,
                    y_shape=self.out_shape, combine=combine)
        self.fns = fns if screen is None else Screened(fns, screen)
        self.horizon = self.cfg.horizon
        self.slots = None if slots is None else slots.n
        self.n = self.slots or 1
        self.per_slot = slots is not None and not slots.shared
        # per-slot models of a learner whose slots may be stepped a few at a time (subset
        # calls: 8 slots or more) step in pairs in every program, so that they round alike
        self.pairs = self.per_slot and self.n >= 8 and self.n % PAIR == 0
        self.donate = bool(compile.donate) if compile.donate is not None else (
            readout is not None or slots is not None or self.fns.in_place)
        self._signature_extra = {"algorithm": self.algo.name, "decay": getattr(self.algo, "decay", None),
                                 "mode": mode, "learn_every": learn_every, "slots": self.slots,
                                 "shared_weights": not self.per_slot, "reduce": reduce,
                                 "x_shape": list(self.x_shape), "out_shape": list(self.out_shape),
                                 "params": sorted(self.algo.graph.param_names),
                                 "channels": None if channels is None else list(channels),
                                 "horizon": self.horizon, "window": metrics.window,
                                 **({"label_delay": self.label_delay} if self.label_delay else {}),
                                 "transform": None if transform is None else transform.describe(),
                                 **({} if screen is None else {"screen": screen.describe()}),
                                 "readout": None if readout is None else readout.describe(),
                                 **({} if combine is None else {"combine": combine.describe()}),
                                 "groups": None if parts.groups is None else parts.groups.describe(),
                                 "frozen": parts.frozen, "model": describe_model(model),
                                 "optimizer": {} if self.fns.opt is None else describe_optimizer(self.fns.opt)}
        # the initial state as one compiled program (built op by op it took ~50 small programs,
        # each compiled or loaded from the cache at every start), the weights as its arguments
        # (as constants they would be embedded in the program and hashed for the cache key)
        p0 = self.algo.graph.init_params()
        shapes = jax.eval_shape(self._init_state, p0)
        # weights no step changes (a frozen model or group) cross as buffers of their own, last,
        # never donated nor returned: a slot bank keeps one copy of them for all its slots
        names = [path_name(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]]
        self.fixed = tuple(self.fns.store.fixed_leaves(names, frozen=not self.fns.learn_model))
        self.layout = Layout(shapes, standalone=compile.standalone, fixed=self.fixed)
        init = jax.jit(lambda p: self.layout.pack(self._init_state(p)))
        init_buffers = init(p0)
        self.buffers = init(p0)     # donated, not the initial ones
        self.programs = Programs(self.layout, self.fns, init_buffers, slots=self.slots, per_slot=self.per_slot,
                                 pairs=self.pairs, donate=self.donate, horizon=self.horizon,
                                 x=(self.x_shape, self.x_dtype), y=(self.out_shape, self.y_dtype))
        self.names = NamedState(self.layout, self.fns.store, self.fns.rolling, self.n, self.per_slot, combine=combine)
        self.checks = CallChecks(self.slots, (self.x_shape, self.x_dtype), (self.out_shape, self.y_dtype),
                                 needs_target=mode == "supervised" and not self.label_delay, label_delay=self.label_delay)

    # ---- state ------------------------------------------------------------------------
    def _init_state(self, params):
        kw = dict(y_shape=self.out_shape, y_dtype=self.y_dtype, params=params)
        if not self.per_slot:
            return {**self.fns.init(self.n, self.x_shape, self.x_dtype, **kw), "rollback": rollback.init(self.n)}
        one = {**self.fns.init(1, self.x_shape, self.x_dtype, **kw), "rollback": rollback.init(1)}
        return jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (self.n,) + v.shape), one)

    def state_dict(self) -> dict:
        """The whole learner state as ``{readable name: numpy array}``; the packed weight
        block and the optimizer state over it are split back into per-parameter names."""
        return self.state_dict_of(self.buffers)

    def state_dict_of(self, buffers) -> dict:
        """``state_dict`` of ``buffers`` (a state of this learner's layout, e.g. a bank's slot)."""
        return self.names.state_dict(buffers)

    def load_state_dict(self, named: dict):
        """Replace the whole state with ``named`` (a ``state_dict`` of a learner built the same
        way); a KeyError / ValueError, and nothing changed, if it does not fit."""
        self.buffers = self.buffers_of(named)

    def buffers_of(self, named: dict) -> tuple:
        """The buffers of a ``state_dict``; a KeyError / ValueError (nothing built) if it
        does not fit this learner's layout."""
        return self.names.buffers(named)

    @property
    def params(self) -> dict:
        """The current weights, ``{parameter name: numpy array}``.

        A copy (changing it changes nothing); with per-slot weights (``Slots(n,
        shared=False)``) every array has the slot axis first.

        Examples
        --------
        >>> import numpy as np, streamtrace as st
        >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
        >>> L = st.OnlineLearner(model, np.zeros(1, np.float32))
        >>> L.params["out.W"].shape, sorted(L.params)[:2]
        ((4, 1), ['cell.n.W', 'cell.n.b'])
        """
        return self.params_of(self.buffers)

    def params_of(self, buffers) -> dict:
        """``params`` of ``buffers``."""
        return self.names.params(buffers)

    def predictor_state(self) -> dict:
        """Everything besides the weights (``params``) that a prediction is made from, as
        ``{name: numpy array}`` (slot axis first, as in ``state_dict``): the readout's weights
        and its choice between ridges, the transforms' statistics (the normaliser's), the
        experts' state. A readout's matrix P, which it learns with and does not predict
        with, is left out (it is in checkpoints).

        >>> import numpy as np, streamtrace as st
        >>> model = st.nn.Reservoir(1, 8)
        >>> L = st.OnlineLearner(model, np.zeros(1, np.float32), mode="forecast", optimizer=st.frozen(),
        ...                      transform=st.normalise(), readout=st.rls())
        >>> sorted(k for k in L.predictor_state() if k.startswith("readout"))
        ['readout.W', 'readout.err']
        """
        return self.predictor_state_of(self.buffers)

    def predictor_state_of(self, buffers) -> dict:
        """``predictor_state`` of ``buffers``."""
        return self.names.predictor_state(buffers)

    def stats(self) -> dict:
        """The learner's counters and scores, as a dict.

        Counters (``step``, ``updates``, ``skipped``, ``rejected``, ``rolled_back``; summed over
        slots with per-slot weights), ``prequential_loss`` per slot (the mean loss of each
        prediction before it was learnt from) and ``metrics``: the rolling prequential
        ``mse``, ``mae``, ``nrmse`` per slot (time constant ``Metrics(window)``), ``n`` scored;
        with an experts' mixture that has a season (``period``, or ``max_period`` detecting it),
        ``seasons``: an int array (slots, channels, 2) of the season its seasonal expert uses and
        the other one found (0: none yet).

        Returns
        -------
        dict

        Examples
        --------
        >>> import numpy as np, streamtrace as st
        >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
        >>> L = st.OnlineLearner(model, np.zeros(1, np.float32))
        >>> _ = L.step(np.ones(1, np.float32), np.ones(1, np.float32))
        >>> s = L.stats()
        >>> s["step"], s["updates"], s["prequential_loss"].shape, sorted(s["metrics"])[:3]
        (1, 1, (1,), ['mae', 'mse', 'n'])
        """
        return self.stats_of(self.buffers)

    def stats_of(self, buffers) -> dict:
        """``stats`` of ``buffers``."""
        return self.names.stats(buffers)

    # ---- calls ------------------------------------------------------------------------
    def step(self, x, target=None, active=None, learn=None) -> StepResult:
        """One step: predict from ``x`` and learn from the target.

        Parameters
        ----------
        x : array_like
            The sample, of the example's shape; with slots (N, *shape).
        target : array_like, optional
            The target of this step's prediction (supervised mode; shape of the prediction,
            with slots (N, ...)). None in forecast or predict mode, or with ``learn`` false.
        active : array_like of bool, shape (N,), optional
            Which slots advance (default all); the others stay as they are.
        learn : array_like of bool, shape (N,), optional
            Which of them learn from this step (default all).

        Returns
        -------
        StepResult
            ``prediction`` (user units), ``loss`` per slot, ``applied`` (an update was
            made), ``outlier`` and ``rolled_back``.

        Examples
        --------
        >>> import numpy as np, streamtrace as st
        >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
        >>> L = st.OnlineLearner(model, np.zeros(1, np.float32))
        >>> r = L.step(np.ones(1, np.float32), target=np.ones(1, np.float32))
        >>> r.prediction.shape, r.loss.shape, bool(r.applied)
        ((1,), (1,), True)
        """
        learn = self.checks.mask(learn, name="learn")
        x, y = self.checks.inputs(x, target, learning=bool(learn.any()))
        self.buffers, vec = self.programs.step()(self.buffers, x, y, self.checks.mask(active), learn)
        return self.programs.decode(np.asarray(vec))

    def step_many(self, xs, targets=None, active=None, learn=None) -> list[StepResult]:
        """``k`` pending steps in one call: the same results as ``k`` calls to ``step``.

        A compiled scan over the steps (one call and one transfer instead of ``k``), for a
        backlog of samples. Arguments as in ``step`` with a leading axis of length ``k``.

        Parameters
        ----------
        xs : array_like, shape (k, ...)
        targets : array_like, shape (k, ...), optional
        active, learn : array_like of bool, shape (k, N), optional

        Returns
        -------
        list of StepResult
            One per step, in order.

        Examples
        --------
        >>> import numpy as np, streamtrace as st
        >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
        >>> L = st.OnlineLearner(model, np.zeros(1, np.float32))
        >>> xs = np.ones((3, 1), np.float32)
        >>> results = L.step_many(xs, targets=xs)
        >>> len(results), L.stats()["step"]
        (3, 3)
        """
        xs = np.asarray(xs)
        k = xs.shape[0]
        learn = self.checks.mask(learn, lead=(k,), name="learn")
        xs, ys = self.checks.inputs(xs, targets, lead=(k,), learning=bool(learn.any()))
        self.buffers, vec = self.programs.step(k)(self.buffers, xs, ys, self.checks.mask(active, lead=(k,)), learn)
        per = np.asarray(vec).reshape(k, -1)
        return [self.programs.decode(v) for v in per]

    def step_slots(self, slots, x, target=None, active=None, learn=None) -> StepResult:
        """One step of the given slots only; the others stay as they are.

        The call costs m slots, not N: for a learner with many streams of which a few have
        new samples.

        Parameters
        ----------
        slots : sequence of int
            Distinct slot indices, 0..N-1 (m of them).
        x : array_like, shape (m, ...)
            Their samples, in the order of ``slots``.
        target : array_like, shape (m, ...), optional
        active, learn : array_like of bool, shape (m,), optional
            As in ``step``, in the order of ``slots``.

        Returns
        -------
        StepResult
            Prediction, loss and applied in the order of ``slots``.

        Examples
        --------
        >>> import numpy as np, streamtrace as st
        >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
        >>> L = st.OnlineLearner(model, np.zeros(1, np.float32), slots=2)
        >>> r = L.step_slots([1], np.ones((1, 1), np.float32), np.ones((1, 1), np.float32))
        >>> r.prediction.shape, bool(L.stats()["prequential_loss"][0] == 0)
        ((1, 1), True)
        """
        if self.slots is None:
            raise ValueError("step_slots needs a learner with slots")
        idx = np.asarray(slots)
        if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"slots must be a non-empty 1-D list of slot indices; got {slots!r}")
        if idx.min() < 0 or idx.max() >= self.n or len(np.unique(idx)) != idx.size:
            raise ValueError(f"slots must be distinct indices in 0..{self.n - 1}; got {idx.tolist()}")
        m = idx.size
        learn = self.checks.mask(learn, name="learn", n=m)
        x, y = self.checks.inputs(x, target, learning=bool(learn.any()), n=m)
        active = self.checks.mask(active, n=m)
        return self.run_subset(idx.astype(np.int32), 1, x[None], y[None], active[None], learn[None])[0]

    # ---- the engine's path (inputs already of the right shapes and dtypes, no validation) ----
    def run(self, x, y, active, learn) -> StepResult:
        """One step on the inputs of ``programs.step()`` (e.g. its ``inputs.views``, filled)."""
        self.buffers, vec = self.programs.run(self.buffers, x, y, active, learn)
        return self.programs.decode(vec)

    def run_loop(self, count: int, xs, ys, active, learn) -> list[StepResult]:
        """``count`` steps of all slots (``Programs.run_loop``), one StepResult each."""
        P = self.programs
        self.buffers, rows = P.run_loop(self.buffers, count, xs, ys, active, learn)
        return [P.decode(rows[j]) for j in range(count)]

    def run_subset(self, idx, count: int, xs, ys, active, learn) -> list[StepResult]:
        """``count`` steps of the slots ``idx`` (``Programs.run_subset``), one StepResult each."""
        P, m = self.programs, len(idx)
        self.buffers, rows = P.run_subset(self.buffers, idx, count, xs, ys, active, learn)
        return [P.decode(rows[j], m=m) for j in range(count)]

    def run_predict(self, key, *inputs) -> StepResult:
        """The first step's prediction of the program ``key`` (``Programs.predict``; None, ("loop",
        k) or ("subset", m, k)) on its inputs, the state untouched (applied flags False)."""
        P = self.programs
        vec = P.run_predict(self.buffers, key, *inputs)
        return P.decode(vec) if key is None else P.decode(vec[0], m=None if key[0] == "loop" else key[1])

    def label(self, y, age: int = 0, slot: int | None = None) -> LabelResult:
        """Give a step's target later: learn from it now.

        With ``mode=Supervised(label_delay=d)`` a step takes no target; its gradient is kept,
        and the target of the step ``age`` steps before ``slot``'s latest (0: the latest,
        up to d - 1) arrives here, when it is known. Raises ``LabelError`` (code
        unknown_label, label_too_late, already_labelled, not_finite, bad_shape) and then
        changes nothing.

        Parameters
        ----------
        y : array_like
            The target, of the prediction's shape (one slot's).
        age : int, default 0
            How many steps before the slot's latest step the labelled one was.
        slot : int, optional
            The slot (needed with slots).

        Returns
        -------
        LabelResult
            ``loss`` of that step's prediction and ``applied``.

        Examples
        --------
        >>> import numpy as np, streamtrace as st
        >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
        >>> L = st.OnlineLearner(model, np.zeros(1, np.float32), mode=st.Supervised(label_delay=2))
        >>> _ = L.step(np.ones(1, np.float32))
        >>> _ = L.step(np.zeros(1, np.float32))
        >>> bool(L.label(np.ones(1, np.float32), age=1).applied)
        True
        """
        self.buffers, *got = self.label_of(self.buffers, y, age, slot)
        return self.label_result(*got, age)

    def label_of(self, buffers, y, age: int = 0, slot: int | None = None):
        """``label`` on ``buffers``: (the new buffers, status, loss, applied, slot) for
        ``label_result``; a bad label raises (``LabelError``) before anything runs. The
        buffers are donated: keep the ones returned, also when ``label_result`` raises."""
        if not self.label_delay:
            raise ValueError("label() needs mode=Supervised(label_delay=d) with d >= 1")
        i = np.int32(0) if self.slots is None and slot is None else self._slot_index(slot)
        y = checked_label(y, age, self.label_delay, self.out_shape, self.y_dtype)
        return (*self.programs.label()(buffers, i, np.int32(age), y), i)

    label_result = staticmethod(label_outcome)
