"""OnlineLearner: a model, an eligibility-trace algorithm, a loss and an optax optimizer,
compiled into one step function whose state crosses the call as a few packed buffers."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .adam import adam
from .algorithms import make_algorithm
from .checkpoint import read_checkpoint, write_checkpoint
from .describe import describe_model, describe_optimizer
from .groups import ParamGroups
from .inputs import PackedInputs
from .losses import get_loss
from .modes import Forecast
from .packing import Layout
from .step import COUNTERS, StepConfig, StepFunctions
from .subset import SlotRows
from .xla_options import step_compiler_options

__all__ = ["OnlineLearner", "StepResult"]

PAIR = 2     # per-slot models step this many slots at a time (see OnlineLearner._in_pairs)


@dataclass(frozen=True)
class StepResult:
    prediction: np.ndarray   # (slots, *out) or (*out) without slots
    loss: np.ndarray         # per slot, of the prediction the user got, in user units (the model's own
                             # loss without transforms or combiner); NaN where the slot did not learn
    applied: bool | np.ndarray  # an optimizer update was applied (per slot with per-slot weights)


class _Call:
    """A compiled step ``fn(small, alone, io)`` (or ``fn(buffers, io)``) called as
    ``fn(buffers, *inputs)``: the inputs cross as one packed buffer (see inputs.py);
    ``inputs.views`` are arrays a caller may fill in place. Its other attributes (``as_text``,
    ``cost_analysis``, ...) are the compiled program's."""

    def __init__(self, compiled, inputs: PackedInputs, n: int | None):
        self.compiled, self.inputs, self.n = compiled, inputs, n

    def __call__(self, buffers, *args):
        io = self.inputs.pack(*args)
        if self.n is None:
            return self.compiled(buffers, io)
        return self.compiled(buffers[:self.n], buffers[self.n:], io)

    def __getattr__(self, name):
        return getattr(self.compiled, name)


class OnlineLearner:
    """Online learning, one step per call.

    >>> learner = OnlineLearner(model, example_x, algorithm="d-rtrl", optimizer=optax.adam(1e-3))
    >>> result = learner.step(x, y)          # predict x's target, then learn from y

    mode: "supervised" (target with x), "forecast" (x_t is the target of the prediction made at
    t-1: learn from it, then predict x_{t+1}), "predict" (no learning; state still advances).
    learn_every=k sums k steps' gradients into one optimizer update. slots=N runs N streams in
    one call, each with its own hidden state and traces; shared_weights=False gives each slot
    its own model; ``step_slots(slots, x)`` steps a few of them only, at their cost.
    Non-finite inputs/losses/gradients never reach the weights: the step is skipped for that
    slot and counted (``stats()``). clip: global-norm gradient clipping.

    Composable parts (each a module of its own):
    mode=Forecast(channels, horizon): forecast some input channels (the rest are exogenous
    inputs) and/or several steps ahead. transform=chain(normalise(), residual()): the signal
    between the user's units and the model. readout=rls(): a closed-form readout over the
    model's output features (the model then returns features, e.g. ``nn.Reservoir``).
    optimizer: an optax transform (default ``adam(lr)``: optax's Adam, applied in place, see
    learner/adam.py), ``param_groups(...)`` (settings per named group), or
    "frozen" (the model's weights never move: a fixed reservoir under the readout).
    ``stats()["metrics"]``: rolling prequential MSE / MAE / NRMSE per slot (time constant
    ``window`` steps). combine=experts(): what the user gets is an online mixture of the
    model's prediction with persistence, a running mean and a seasonal naive forecast, weighted
    by their recent losses (learner/experts.py; forecast and supervised modes).

    The state crosses the compiled call as a few buffers: small leaves packed per dtype, leaves
    of at least ``standalone`` elements (weights, moments, traces) as buffers of their own.
    ``donate=True`` lets XLA reuse the standalone input buffers. Default: on with a readout (it
    saves a copy of the RLS matrix and of frozen weights every step), with slots and with an
    optimizer that updates in place (``adam``, the default); a plain learner with ``optax.adam``
    keeps its inputs (XLA would have to copy its guarded moments). Each was faster where it is
    on; the timings: docs/decisions/step-details.md.
    """

    def __init__(self, model, example_x, *, algorithm="d-rtrl", decay=None, rank=None, signal=None,
                 loss="mse", optimizer=None, lr: float = 1e-3,
                 mode="supervised", learn_every: int = 1, slots: int | None = None,
                 shared_weights: bool = True, reduce: str = "mean", clip: float | None = None,
                 batch_size: int | None = None, donate: bool | None = None, standalone: int | None = 2048,
                 transform=None, readout=None, window: int = 1000, combine=None):
        example_x = np.asarray(example_x)
        if slots is not None and slots < 1:
            raise ValueError(f"slots must be >= 1; got {slots}")
        if clip is not None and not clip > 0:
            raise ValueError(f"clip must be > 0; got {clip}")
        spec = mode if isinstance(mode, Forecast) else (Forecast() if mode == "forecast" else None)
        mode = "forecast" if spec is not None else mode
        brainstate.nn.init_all_states(model, batch_size)
        self.model = model
        self.algo = make_algorithm(algorithm, model, jnp.asarray(self._model_input(example_x, transform, readout)),
                                   decay=decay, rank=rank, signal=signal)
        out = self.algo.graph.out_struct
        if not hasattr(out, "shape"):
            raise ValueError("the model must return one array (the prediction)")
        self.x_shape, self.x_dtype = tuple(example_x.shape), example_x.dtype
        channels = self._channels(spec)
        self.out_shape, self.y_dtype = self._output(out, readout, mode, channels)
        groups = optimizer if isinstance(optimizer, ParamGroups) else None
        if optimizer is None:
            optimizer = adam(lr)
        elif not (groups is not None or isinstance(optimizer, optax.GradientTransformation)
                  or (isinstance(optimizer, str) and optimizer == "frozen")):
            raise TypeError(f"optimizer must be an optax transform, param_groups(...) or 'frozen'; got {optimizer!r}")
        frozen = isinstance(optimizer, str)
        self.cfg = StepConfig(mode, learn_every, reduce, channels, spec.horizon if spec else 1, window)
        self.fns = StepFunctions(self.algo, get_loss(loss), None if groups else optimizer, self.cfg,
                                 transform=transform, readout=readout, groups=groups, y_shape=self.out_shape,
                                 clip=clip, combine=combine)
        self.horizon = self.cfg.horizon
        self.slots, self.n = slots, slots or 1
        self.per_slot = slots is not None and not shared_weights
        # per-slot models of a learner whose slots may be stepped a few at a time (subset
        # calls: 8 slots or more) step in pairs in every program, so that they round alike
        self.pairs = self.per_slot and self.n >= 8 and self.n % PAIR == 0
        self.donate = bool(donate) if donate is not None else (
            readout is not None or slots is not None or self.fns.in_place)
        self._signature_extra = {"algorithm": self.algo.name, "decay": getattr(self.algo, "decay", None),
                                 "mode": mode, "learn_every": learn_every, "slots": slots,
                                 "shared_weights": bool(shared_weights) or slots is None, "reduce": reduce,
                                 "x_shape": list(self.x_shape), "out_shape": list(self.out_shape),
                                 "params": sorted(self.algo.graph.param_names),
                                 "channels": None if channels is None else list(channels),
                                 "horizon": self.horizon, "window": window,
                                 "transform": None if transform is None else transform.describe(),
                                 "readout": None if readout is None else readout.describe(),
                                 **({} if combine is None else {"combine": combine.describe()}),
                                 "groups": None if groups is None else groups.describe(),
                                 "frozen": frozen, "model": describe_model(model),
                                 "optimizer": {} if self.fns.opt is None else describe_optimizer(self.fns.opt)}
        # the initial state as one compiled program (built op by op it took ~50 small programs,
        # each compiled or loaded from the cache at every start), the weights as its arguments
        # (as constants they would be embedded in the program and hashed for the cache key)
        p0 = self.algo.graph.init_params()
        self.layout = Layout(jax.eval_shape(self._init_state, p0), standalone=standalone)
        init = jax.jit(lambda p: self.layout.pack(self._init_state(p)))
        self._init_buffers = init(p0)
        self.buffers = init(p0)     # donated, not the initial ones
        # the buffers' shapes, to compile from: the buffers themselves may be donated (deleted)
        # by a step on the serving thread while another thread compiles (the engine's warm-up)
        self._avals = tuple(jax.ShapeDtypeStruct(b.shape, b.dtype) for b in self.buffers)
        self._compiled = {}
        self._compile_lock = threading.Lock()   # one thread traces and compiles at a time
        self._slot_shapes = None
        self._state_dict_signature = None
        self._ones = np.ones(self.n, bool)
        self._no_target = np.zeros((self.n,) + self.out_shape if slots else self.out_shape, self.y_dtype)

    @staticmethod
    def _model_input(example_x, transform, readout):
        """An example of the model's input: x, widened by transforms that add inputs (feedback)."""
        if transform is None or example_x.ndim != 1:
            return example_x
        n = transform.widen(example_x.shape[0], getattr(readout, "n_out", None))
        return example_x if n == example_x.shape[0] else np.zeros(n, example_x.dtype)

    def _channels(self, spec):
        if spec is None or spec.channels is None:
            return None
        if len(self.x_shape) != 1:
            raise ValueError(f"Forecast(channels=...) needs 1-D inputs; the example x has shape {self.x_shape}")
        bad = [c for c in spec.channels if c >= self.x_shape[0]]
        if bad:
            raise ValueError(f"Forecast: channels {bad} out of range for {self.x_shape[0]} input channels")
        return spec.channels

    def _output(self, out, readout, mode, channels):
        """The prediction's (shape, dtype) for one step, checked against the mode."""
        want = self.x_shape if channels is None else (len(channels),)
        if readout is not None:
            n_out = readout.n_out or (int(np.prod(want)) if mode == "forecast" else None)
            if n_out is None:
                raise ValueError("rls readout in supervised mode: give n_out (the target size)")
            shape = (n_out,) if mode != "forecast" or channels is not None else want
            if mode == "forecast" and int(np.prod(shape)) != int(np.prod(want)):
                raise ValueError(f"forecast mode predicts {want}; the readout has n_out = {n_out}")
            return tuple(shape), np.dtype(out.dtype)
        if mode == "forecast" and tuple(out.shape) != want:
            raise ValueError(f"forecast mode predicts the next input{'' if channels is None else ' channels'}: "
                             f"the model output {tuple(out.shape)} must have shape {want}")
        return tuple(out.shape), np.dtype(out.dtype)

    # ---- state ------------------------------------------------------------------------
    def _init_state(self, params):
        kw = dict(y_shape=self.out_shape, y_dtype=self.y_dtype, params=params)
        if not self.per_slot:
            return self.fns.init(self.n, self.x_shape, self.x_dtype, **kw)
        one = self.fns.init(1, self.x_shape, self.x_dtype, **kw)
        return jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (self.n,) + v.shape), one)

    def state_dict(self) -> dict:
        """The whole learner state as ``{readable name: numpy array}``; the packed weight
        block and the optimizer state over it are split back into per-parameter names."""
        return self._expand(self.layout.to_named(self.buffers))

    def load_state_dict(self, named: dict):
        compact = self._collapse(named)
        missing = set(self.layout.names) - set(compact)
        if missing:
            raise KeyError(f"state is missing {sorted(missing)[:5]}")
        for name, shape, _ in self.layout.entries():
            if tuple(np.shape(compact[name])) != shape:
                raise ValueError(f"state '{name}' has shape {np.shape(compact[name])}, expected {shape}")
        self.buffers = self.layout.from_named(compact)

    def _expand(self, named):
        out = {}
        for name, v in named.items():
            found = self.fns.store.block_of(name, np.shape(v))
            if found is None:
                out[name] = v
                continue
            pl = found[1]
            lead = v.shape[:-2]
            flat = v.reshape(lead + (-1,))
            for slot in pl.slots:
                start = pl.offset(slot)
                out[f"{name}.{slot.name}"] = flat[..., start:start + slot.size].reshape(lead + slot.shape)
        return out

    def _collapse(self, named):
        out = {}
        for name, shape, dtype in self.layout.entries():
            found = self.fns.store.block_of(name, shape)
            if name in named:
                out[name] = named[name]
            elif found is not None and all(f"{name}.{p.name}" in named for p in found[1].slots):
                pl = found[1]
                lead = shape[:-2]
                flat = np.zeros(lead + (int(np.prod(shape[-2:])),), dtype)
                for p in pl.slots:
                    start = pl.offset(p)
                    flat[..., start:start + p.size] = np.asarray(named[f"{name}.{p.name}"]).reshape(lead + (-1,))
                out[name] = flat.reshape(shape)
        return out

    @property
    def params(self) -> dict:
        """Current weights, ``{parameter name: numpy array}`` (per-slot weights: slot axis first)."""
        named = self.layout.to_named(self.buffers, prefix="params")
        store = self.fns.store
        if store.separate:
            stored = {k[len("params."):]: v for k, v in named.items()}
        else:
            stored = named["params"] if store.groups is None else {g: named[f"params.{g}"] for g in store.layouts}
        if not self.per_slot:
            return {k: np.asarray(v) for k, v in store.unpack(stored).items()}
        per = [store.unpack(jax.tree_util.tree_map(lambda a: a[i], stored)) for i in range(self.n)]
        return {k: np.stack([np.asarray(p[k]) for p in per]) for k in per[0]}

    def stats(self) -> dict:
        """Counters (summed over slots with per-slot weights) and per-slot prequential loss."""
        named = self.layout.to_named(self.buffers, prefix="stats.")
        counters = named["stats.counters"].reshape(-1, len(COUNTERS))
        out = {name: int(counters[:, i].sum()) for i, name in enumerate(COUNTERS) if name != "since_update"}
        if self.per_slot:
            out["step"] = int(counters[:, 0].max())
        n = np.maximum(named["stats.preq_n"], 1)
        out["prequential_loss"] = (named["stats.preq_sum"] / n).reshape(-1)
        roll = {k[len("stats.roll."):]: v for k, v in named.items() if k.startswith("stats.roll.")}
        roll = {k: v.reshape(-1) if k == "n" else v.reshape(-1, v.shape[-1]) for k, v in roll.items()}
        out["metrics"] = self.fns.rolling.summary(roll)
        return out

    # ---- the compiled step ------------------------------------------------------------
    def _core(self, state, x, y, active, learn):
        """One step on named state; x/y/active/learn carry the slot axis (size N)."""
        if not self.per_slot:
            return self.fns.step(state, x, y, active, learn)
        if self.pairs:
            return self._in_pairs(state, x, y, active, learn)
        return self._each_model(state, x, y, active, learn)

    def _each_model(self, s, x, y, a, l):
        """The given slots' steps, a model each, vmapped over them (a pair in ``_in_pairs``)."""
        def one(s, x, y, a, l):
            s, out, loss, applied = self.fns.step(s, x[None], y[None], a[None], l[None])
            return s, out[0], loss[0], applied
        return jax.vmap(one)(s, x, y, a, l)

    def _idle_pair(self, s, like):
        """Two idle slots: their state as it is, but for the count of calls (as the step
        counts an inactive slot); no prediction, no loss, no update."""
        counters = s["stats"]["counters"].at[:, COUNTERS.index("step")].add(1)
        out, loss, applied = (jnp.zeros(v.shape, v.dtype) for v in like)
        return ({**s, "stats": {**s["stats"], "counters": counters}}, out, loss + jnp.nan, applied)

    def _in_pairs(self, state, x, y, active, learn):
        """Per-slot models, two slots at a time in a loop (pairs without an active slot skip
        their step). Every program -- one step, a micro-batch, a subset of any size -- then
        runs the same two-slot computation: XLA compiles a step for the number of slots it
        is given, and with 2, 4, 16 or 64 it chose different kernels that rounded the same
        slot differently (docs/decisions/determinism.md). A slot keeps its place in its pair
        (slots 2k and 2k+1) in every program: the engine's subset calls take whole pairs.
        The loop's count is hidden from XLA, which would otherwise inline a loop of one pair
        and compile it in context."""
        n, c = x.shape[0], PAIR
        if n % c:     # an odd subset (step_slots): one more slot, idle, its results dropped
            grow = lambda v, fill=None: jnp.concatenate([v, v[-1:] if fill is None else jnp.full_like(v[-1:], fill)])
            state, out, loss, applied = self._in_pairs(jax.tree_util.tree_map(grow, state), grow(x), grow(y),
                                                       grow(active, False), grow(learn, False))
            return jax.tree_util.tree_map(lambda v: v[:n], state), out[:n], loss[:n], applied[:n]
        part = lambda tree, j: jax.tree_util.tree_map(lambda v: jax.lax.dynamic_slice_in_dim(v, j * c, c, 0), tree)
        like = jax.eval_shape(self._each_model, part(state, 0), x[:c], y[:c], active[:c], learn[:c])[1:]
        outs = tuple(jnp.zeros((n,) + v.shape[1:], v.dtype) for v in like)

        def body(j, carry):
            state, outs = carry
            args = (part(state, j), part(x, j), part(y, j), part(active, j), part(learn, j))
            s, *got = jax.lax.cond(jnp.any(args[3]), lambda a: self._each_model(*a),
                                   lambda a: self._idle_pair(a[0], like), args)
            put = lambda v, u: jax.lax.dynamic_update_slice_in_dim(v, u, j * c, 0)
            return jax.tree_util.tree_map(put, state, s), tuple(put(o, g) for o, g in zip(outs, got))
        pairs = jax.lax.optimization_barrier(jnp.int32(n // c))
        state, (out, loss, applied) = jax.lax.fori_loop(0, pairs, body, (state, outs))
        return state, out, loss, applied

    def _pack_out(self, out, loss, applied):
        dt = jnp.result_type(out.dtype, jnp.float32)
        return jnp.concatenate([jnp.ravel(out).astype(dt), loss.astype(dt), jnp.ravel(applied).astype(dt)])

    def _fn(self, k: int | None):
        """The pure packed step: (buffers, x, y, active, learn) -> (buffers, out vector).
        k=None: one step; k: a scan over k pending steps (micro-batching)."""
        layout = self.layout

        def fn(buffers, x, y, active, learn):
            state, vec = self._steps(layout.unpack(buffers), k, x, y, active, learn)
            return layout.pack(state), vec
        return fn

    def _steps(self, state, k, x, y, active, learn):
        squeeze = self.slots is None

        def single(state, x, y, active, learn):
            if squeeze:
                x, y = x[None], y[None]
            state, out, loss, applied = self._core(state, x, y, active, learn)
            return state, self._pack_out(out[0] if squeeze else out, loss, applied)
        if k is None:
            return single(state, x, y, active, learn)
        state, vecs = jax.lax.scan(lambda s, xs: single(s, *xs), state, (x, y, active, learn))
        return state, jnp.ravel(vecs)

    def _loop_steps(self, state, count, xs, ys, active, learn):
        """The first ``count`` of the K steps in xs (K, slots, ...): (state, (K, vector))."""
        one = jax.eval_shape(lambda s: self._steps(s, None, xs[0], ys[0], active[0], learn[0])[1], state)
        vecs = jnp.zeros((xs.shape[0],) + one.shape, one.dtype)

        def body(i, carry):
            state, vecs = carry
            state, vec = self._steps(state, None, xs[i], ys[i], active[i], learn[i])
            return state, vecs.at[i].set(vec)
        return jax.lax.fori_loop(0, count, body, (state, vecs))

    def _fn_loop(self):
        """Steps of all slots: (buffers, count, xs, ys, active, learn) with xs (K, N, ...): the
        first ``count`` (<= K) steps run, in a loop of run-time length. Every step of it is the
        same loop body as a subset call's, so a slot's numbers are the same bits whichever of
        the two served it (docs/decisions/determinism.md)."""
        layout = self.layout

        def fn(buffers, count, xs, ys, active, learn):
            state, vecs = self._loop_steps(layout.unpack(buffers), count, xs, ys, active, learn)
            return layout.pack(state), vecs
        return fn

    def _fn_subset(self):
        """Steps of m of the N slots: (buffers, idx (m,), count, xs, ys, active, learn) with
        xs (K, m, ...): the first ``count`` (<= K) steps run. The m slots' state is read from
        the buffers (one gather per packed buffer, see subset.py), stepped and written back;
        the other slots are not read or written, so a call costs m slots, not N. Equal to the
        full step with only those slots active (tests/test_slot_subset.py)."""
        layout, n = self.layout, self.n
        rows = SlotRows(layout, self._slot_names(), n)

        def fn(buffers, idx, count, xs, ys, active, learn):
            got = rows.gather(buffers, idx)
            full = layout.treedef.flatten_up_to(layout.unpack(buffers))
            state = jax.tree_util.tree_unflatten(layout.treedef, [got.get(k, v) for k, v in zip(layout.names, full)])
            # a loop of run-time length: its carry is a buffer of its own, so the step reads
            # the m gathered slots from there (a fused gather out of the N-slot buffers would
            # make XLA copy those whole before writing back into them)
            state, vecs = self._loop_steps(state, count, xs, ys, active, learn)
            out = rows.scatter(buffers, idx, dict(zip(layout.names, layout.treedef.flatten_up_to(state))))
            if self.per_slot:     # every slot counts every call as a step, as in the full step
                others = jnp.ones(n, jnp.int32).at[idx].set(0)
                out = rows.add_to_column(out, "stats.counters", COUNTERS.index("step"), count * others)
            return out, vecs
        return fn

    def _slot_names(self) -> list[str]:
        """The names of the per-slot leaves (``_slot_part`` of the state with its names as leaves)."""
        return jax.tree_util.tree_leaves(self._slot_part(jax.tree_util.tree_unflatten(
            self.layout.treedef, list(self.layout.names))))

    def _program(self, key, build):
        """The compiled program ``key``, built once (``build()``) by whichever thread asks
        first; a program is never seen half-built, and two threads never trace at once."""
        prog = self._compiled.get(key)
        if prog is None:
            with self._compile_lock:
                prog = self._compiled.get(key)
                if prog is None:
                    prog = self._compiled[key] = build()
        return prog

    def is_compiled(self, key) -> bool:
        return key in self._compiled

    def compiled(self, k: int | None = None):
        """The AOT-compiled packed step (cached per micro-batch size)."""
        def build():
            x, y, a = self._example_inputs(k)
            return self._packed(self._fn(k), (x, y, a, a), self._options(self.n, loop=k is not None),
                                donate="alone" if self.donate else None)
        return self._program(k, build)

    def _options(self, slots, loop):
        return step_compiler_options(slots, leaf_guards=self.fns.opt is not None and not self.fns.in_place, loop=loop)

    def _packed(self, fn, args, options, donate: str | None):
        """``fn(buffers, *args)`` compiled as a ``_Call`` whose args cross as one packed buffer.
        ``donate``: None, "all" buffers, or "alone": the standalone buffers (weights, moments,
        traces, an RLS matrix) but not the few packed small ones. XLA reads and rewrites those in
        one program, so donated it copies them first, and the copy reorders and slows a small
        step (measured: docs/decisions/step-details.md)."""
        inputs = PackedInputs(args)
        if donate == "alone":
            n = len(self.layout.dtypes)
            run = jax.jit(lambda small, alone, io: fn(small + alone, *inputs.unpack(io)), donate_argnums=(1,))
            return _Call(run.lower(self._avals[:n], self._avals[n:], inputs.buffer).compile(options), inputs, n)
        run = jax.jit(lambda buffers, io: fn(buffers, *inputs.unpack(io)), donate_argnums=(0,) if donate == "all" else ())
        return _Call(run.lower(self._avals, inputs.buffer).compile(options), inputs, None)

    def compiled_subset(self, m: int, k: int = 1):
        """The AOT-compiled steps of m slots, up to k steps per call (see ``_fn_subset``).
        Its buffers are always donated: the m slots are written back in place."""
        if self.slots is None or not 1 <= m <= self.n or k < 1:
            raise ValueError(f"a subset step needs a learner with slots, 1 <= m <= {self.n} and k >= 1; "
                             f"got m={m}, k={k}")
        def build():
            x, y, a = self._example_inputs(k, m)
            return self._packed(self._fn_subset(), (np.zeros(m, np.int32), np.int32(1), x, y, a, a),
                                self._options(m, loop=True), donate="all")
        return self._program(("subset", m, k), build)

    def compiled_loop(self, k: int):
        """The AOT-compiled steps of all slots, up to k steps per call, their number given at
        run time (see ``_fn_loop``): one program for any micro-batch size."""
        if k < 1:
            raise ValueError(f"a loop step needs k >= 1; got k={k}")

        def build():
            x, y, a = self._example_inputs(k)
            return self._packed(self._fn_loop(), (np.int32(1), x, y, a, a), self._options(self.n, loop=True),
                                donate="alone" if self.donate else None)
        return self._program(("loop", k), build)

    def _example_inputs(self, k, n=None):
        lead = () if k is None else (k,)
        slot = () if self.slots is None else (n or self.n,)
        x = np.zeros(lead + slot + self.x_shape, self.x_dtype)
        y = np.zeros(lead + slot + self.out_shape, self.y_dtype)
        return x, y, np.ones(lead + (n or self.n,), bool)

    def pure_step(self):
        """The step as a pure function of the named state tree (for tests and composition)."""
        def step(state, x, y=None, active=None, learn=None):
            y = jnp.zeros(jnp.shape(x)[:-len(self.x_shape)] + self.out_shape) if y is None else y
            active = jnp.ones(self.n, bool) if active is None else active
            learn = jnp.ones(self.n, bool) if learn is None else learn
            squeeze = self.slots is None
            xs, ys = (x[None], y[None]) if squeeze else (x, y)
            state, out, loss, applied = self._core(state, xs, ys, active, learn)
            return state, (out[0] if squeeze else out), loss, applied
        return step

    # ---- calls ------------------------------------------------------------------------
    def _check(self, x, y, lead=(), learning=True, n=None):
        n = n or self.n
        x = np.asarray(x, self.x_dtype)
        want = lead + (() if self.slots is None else (n,)) + self.x_shape
        if x.shape != want:
            raise ValueError(f"x has shape {x.shape}, expected {want}")
        if y is None:
            if self.cfg.mode == "supervised" and learning:
                raise ValueError("supervised mode needs a target with every x (or learn=False)")
            y = self._no_target if not lead and n == self.n else \
                np.zeros(lead + (() if self.slots is None else (n,)) + self.out_shape, self.y_dtype)
        else:
            y = np.asarray(y, self.y_dtype)
            want = lead + (() if self.slots is None else (n,)) + self.out_shape
            if y.shape != want:
                raise ValueError(f"target has shape {y.shape}, expected {want}")
        return x, y

    def _mask(self, mask, lead=(), name="active", n=None):
        n = n or self.n
        if mask is None:
            return self._ones if not lead and n == self.n else np.ones(lead + (n,), bool)
        mask = np.asarray(mask, bool)
        if mask.shape != lead + (n,):
            raise ValueError(f"{name} has shape {mask.shape}, expected {lead + (n,)}")
        return mask

    def step(self, x, target=None, active=None, learn=None) -> StepResult:
        """One step. Without slots: x of the example's shape. With slots: (N, *shape).
        active (N,): which slots advance; learn (N,): which of them learn from this step."""
        learn = self._mask(learn, name="learn")
        x, y = self._check(x, target, learning=bool(learn.any()))
        self.buffers, vec = self.compiled()(self.buffers, x, y, self._mask(active), learn)
        return self._decode(np.asarray(vec))

    def step_many(self, xs, targets=None, active=None, learn=None) -> list[StepResult]:
        """k pending steps in one call (a scan): the same result as k calls to ``step``."""
        xs = np.asarray(xs)
        k = xs.shape[0]
        learn = self._mask(learn, lead=(k,), name="learn")
        xs, ys = self._check(xs, targets, lead=(k,), learning=bool(learn.any()))
        self.buffers, vec = self.compiled(k)(self.buffers, xs, ys, self._mask(active, lead=(k,)), learn)
        per = np.asarray(vec).reshape(k, -1)
        return [self._decode(v) for v in per]

    def step_unchecked(self, x, y, active, learn, k: int | None = None) -> np.ndarray:
        """The engine's path: arrays already of the right shapes and dtypes (a leading k axis
        for k steps), no validation; returns the raw output vector (see ``decode``)."""
        self.buffers, vec = self.compiled(k)(self.buffers, x, y, active, learn)
        return np.asarray(vec)

    def step_loop_unchecked(self, count: int, xs, ys, active, learn) -> np.ndarray:
        """The engine's path for many busy slots: ``count`` steps of all slots; xs, ys,
        active, learn (K, N, ...) of which the first ``count`` are used (K: the compiled size,
        see ``compiled_loop``). Returns (K, vector) rows; the first ``count`` are the steps'."""
        self.buffers, vecs = self.compiled_loop(len(xs))(self.buffers, np.int32(count), xs, ys, active, learn)
        return np.asarray(vecs)

    def step_subset_unchecked(self, idx, count: int, xs, ys, active, learn) -> np.ndarray:
        """The engine's path for a few busy slots: ``count`` steps of slots ``idx`` (m,)
        int32, distinct; xs, ys, active, learn (K, m, ...) of which the first ``count`` are
        used (K: the compiled size, see ``compiled_subset``). Returns (K, vector) rows; the
        first ``count`` are the steps' results (``decode(row, m=m)``)."""
        m, k = len(idx), len(xs)
        self.buffers, vecs = self.compiled_subset(m, k)(self.buffers, idx, np.int32(count), xs, ys, active, learn)
        return np.asarray(vecs)

    def step_slots(self, slots, x, target=None, active=None, learn=None) -> StepResult:
        """One step of the given slots only (distinct indices); x (m, *shape), target,
        active and learn (m,) in their order. The other slots stay as they are, and the call
        costs m slots, not N. Results (prediction, loss, applied) are in the order of ``slots``."""
        if self.slots is None:
            raise ValueError("step_slots needs a learner with slots")
        idx = np.asarray(slots)
        if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"slots must be a non-empty 1-D list of slot indices; got {slots!r}")
        if idx.min() < 0 or idx.max() >= self.n or len(np.unique(idx)) != idx.size:
            raise ValueError(f"slots must be distinct indices in 0..{self.n - 1}; got {idx.tolist()}")
        m = idx.size
        learn = self._mask(learn, name="learn", n=m)
        x, y = self._check(x, target, learning=bool(learn.any()), n=m)
        active = self._mask(active, n=m)
        rows = self.step_subset_unchecked(idx.astype(np.int32), 1, x[None], y[None], active[None], learn[None])
        return self._decode(rows[0], m)

    def decode(self, vec, k: int | None = None, m: int | None = None) -> list[StepResult] | StepResult:
        """Split ``step_unchecked``'s vector into StepResults (a list when k is given);
        m: the slot count of a subset step."""
        return self._decode(vec, m) if k is None else [self._decode(v, m) for v in vec.reshape(k, -1)]

    def _decode(self, vec, n: int | None = None) -> StepResult:
        n = n or self.n
        one = self.out_shape if self.horizon == 1 else (self.horizon,) + self.out_shape
        pred_shape = one if self.slots is None else (n,) + one
        n_out = math.prod(pred_shape)
        pred = vec[:n_out].reshape(pred_shape)
        loss = vec[n_out:n_out + n]
        applied = vec[n_out + n:] > 0.5
        return StepResult(pred, loss, applied if self.per_slot else bool(applied[0]))

    def reset_slot(self, slot: int):
        """A stream left and another joins: fresh hidden state and traces for ``slot`` (and,
        with per-slot weights, fresh weights); other slots are untouched."""
        self.buffers = self.compiled_reset()(self.buffers, self._slot_index(slot))

    def compiled_reset(self):
        """The compiled slot reset: (buffers, slot) -> buffers."""
        init = self._init_buffers

        def reset(buffers, i):
            state = self.layout.unpack(buffers)
            fresh = self._slot_part(self.layout.unpack(init))    # in the program: no eager ops
            part = jax.tree_util.tree_map(lambda a, b: a.at[i].set(b[i]), self._slot_part(state), fresh)
            return self.layout.pack(self._with_slot_part(state, part))
        return self._program("reset", lambda: jax.jit(reset).lower(self._avals, np.int32(0)).compile())

    def _slot_part(self, state) -> dict:
        """The leaves of ``state`` that belong to the slots (slot axis first): everything with
        per-slot weights; otherwise hidden state, traces, pending input, the signal transform's
        statistics, the readout and the per-slot loss and rolling metrics. One definition for
        ``reset_slot`` and for ``read_slot`` / ``write_slot`` (the engine's parking)."""
        if self.per_slot:
            return state
        part = {k: state[k] for k in ("hidden", "traces", "pending", "signal", "readout", "combine") if k in state}
        part["stats"] = {k: state["stats"][k] for k in ("preq_sum", "preq_n", "roll")}
        return part

    def _with_slot_part(self, state, part) -> dict:
        """``state`` with its slot leaves replaced by ``part`` (a ``_slot_part``)."""
        if self.per_slot:
            return part
        return {**state, **{k: v for k, v in part.items() if k != "stats"},
                "stats": {**state["stats"], **part["stats"]}}

    def _slot_index(self, slot: int) -> np.int32:
        if self.slots is None:
            raise ValueError("slot access needs a learner with slots")
        if not 0 <= slot < self.n:
            raise IndexError(f"slot {slot} out of range 0..{self.n - 1}")
        return np.int32(slot)

    def read_slot(self, slot: int) -> dict:
        """One slot's state as numpy arrays (hidden state, traces, pending forecast input,
        loss; with per-slot weights also its weights, optimizer state and counters), to be
        put back later with ``write_slot``, into this slot or another."""
        i = self._slot_index(slot)
        return jax.device_get(self.compiled_read_slot()(self.buffers, i))

    def compiled_read_slot(self):
        """The compiled slot read: (buffers, slot) -> that slot's ``_slot_part``."""
        def read(buffers, i):
            return jax.tree_util.tree_map(lambda a: a[i], self._slot_part(self.layout.unpack(buffers)))
        return self._program("read_slot", lambda: jax.jit(read).lower(self._avals, np.int32(0)).compile())

    def compiled_write_slot(self):
        """The compiled slot write: (buffers, slot, part) -> buffers."""
        def write(buffers, i, part):
            state = self.layout.unpack(buffers)
            new = jax.tree_util.tree_map(lambda a, b: a.at[i].set(b), self._slot_part(state), part)
            return self.layout.pack(self._with_slot_part(state, new))
        return self._program("write_slot", lambda: jax.jit(write).lower(self._avals, np.int32(0),
                                                                          self._slot_struct()).compile())

    def _slot_struct(self):
        """One slot's part as shapes (traced once)."""
        if self._slot_shapes is None:
            self._slot_shapes = jax.eval_shape(lambda b: jax.tree_util.tree_map(
                lambda a: a[0], self._slot_part(self.layout.unpack(b))), self._avals)
        return self._slot_shapes

    def write_slot(self, slot: int, part: dict):
        """Replace ``slot``'s state with ``part`` (from ``read_slot``); other slots are untouched."""
        i = self._slot_index(slot)
        program = self.compiled_write_slot()
        want = self._slot_struct()
        if jax.tree_util.tree_structure(part) != jax.tree_util.tree_structure(want) or any(
                np.shape(a) != w.shape for a, w in zip(jax.tree_util.tree_leaves(part), jax.tree_util.tree_leaves(want))):
            raise ValueError("slot state does not match this learner's slot layout (use read_slot of the same learner)")
        part = jax.tree_util.tree_map(lambda a, w: np.asarray(a, w.dtype), part, want)
        self.buffers = program(self.buffers, i, part)

    # ---- checkpoints ------------------------------------------------------------------
    def signature(self) -> dict:
        """What a checkpoint must match: the settings, the packed layout ("state"), and the
        saved arrays themselves ("state_dict": name, shape, dtype of every ``state_dict()``
        entry). The arrays do not depend on how the state is stored (one packed weight block
        or an array per weight), so a checkpoint is checked by them when both sides have them."""
        if self._state_dict_signature is None:
            zeros = {n: np.zeros(shape, dt) for n, shape, dt in self.layout.entries()}
            self._state_dict_signature = [[n, list(np.shape(v)), np.asarray(v).dtype.str]
                                          for n, v in self._expand(zeros).items()]
        return {**self._signature_extra, "state": self.layout.signature(),
                "state_dict": self._state_dict_signature}

    def save(self, path, extra: dict | None = None):
        """Write the whole state atomically to ``path`` (temp file + fsync + rename)."""
        return write_checkpoint(path, self.state_dict(), self.signature(), extra)

    def restore(self, path) -> dict:
        """Load a checkpoint written by ``save``; refuses other models or corrupted files."""
        arrays, header = read_checkpoint(path, expect_signature=self.signature())
        self.load_state_dict(arrays)
        return header

