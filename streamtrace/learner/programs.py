"""A learner's compiled programs: what the engine calls (``learner.programs``).

The user steps a learner through ``OnlineLearner.step`` / ``step_many`` / ``step_slots``;
the engine needs more: the packed programs themselves (to fill their input views in place
and to compile them on a warm-up thread), runs without validation, and the raw output
vector decoded apart. Those live here, apart from the user's surface.

Every program is built once, by whichever thread asks first, under one lock (two threads
never trace at once), from the state's shapes (``avals``): the buffers themselves may be
donated by a step on the serving thread while another thread compiles. Per-slot models of
a learner that may step a few slots at a time step in pairs in every program, so that all
of them round alike (``_in_pairs``, docs/decisions/determinism.md).
"""
from __future__ import annotations

import math
import threading

import jax
import jax.numpy as jnp
import numpy as np

from .inputs import PackedInputs
from .labels import MOVING, PairRing, apply_label
from .result import StepResult
from .rollback import gate, gate_buffers
from .step import COUNTERS
from .subset import SlotRows
from .xla_options import step_compiler_options

__all__ = ["Programs", "PAIR"]

PAIR = 2     # per-slot models step this many slots at a time (see Programs._in_pairs)
EVENTS = ("screen", "rollback")     # state entries whose "now" (per slot) a step's result reports


class _Call:
    """A compiled step ``fn(small, alone, fixed, io)`` (or ``fn(buffers, io)``) called as
    ``fn(buffers, *inputs)``: the inputs cross as one packed buffer (see inputs.py);
    ``inputs.views`` are arrays a caller may fill in place. ``cut`` (n, f): buffers[:n] small,
    [n:f] standalone, [f:] fixed weights, which the program neither donates nor returns: the
    call hands the same arrays back in its buffers. Its other attributes (``as_text``,
    ``cost_analysis``, ...) are the compiled program's."""

    def __init__(self, compiled, inputs: PackedInputs, cut: tuple | None):
        self.compiled, self.inputs, self.cut = compiled, inputs, cut

    def __call__(self, buffers, *args):
        io = self.inputs.pack(*args)
        if self.cut is None:
            return self.compiled(buffers, io)
        n, f = self.cut
        fixed = buffers[f:]
        out, *rest = self.compiled(buffers[:n], buffers[n:f], fixed, io)
        return (out + fixed, *rest)

    def __getattr__(self, name):
        return getattr(self.compiled, name)


class Programs:
    """The compiled programs of one learner: functions of (buffers, inputs) -> (buffers,
    outputs). They hold no state; whoever owns the buffers (the learner, a slot bank's slot)
    passes them in and keeps what comes back.

    Programs (each compiled once, cached by key): ``step(k)`` (key k: None for one step, or
    a scan of k), ``loop(k)`` (("loop", k)), ``subset(m, k)`` (("subset", m, k)), ``reset()``,
    ``read_slot()``, ``write_slot()``. Runs without validation: ``run``, ``run_loop``,
    ``run_subset``; ``decode`` splits their output vectors. ``pure_step()``: the step as a
    pure function of the named state tree."""

    def __init__(self, layout, fns, init_buffers, *, slots, per_slot, pairs, donate, horizon, x, y):
        """``layout`` (packing.Layout) and ``fns`` (step.StepFunctions) of a learner whose
        initial state is ``init_buffers``; ``slots`` (None: no slot axis), ``per_slot`` (a
        model per slot), ``pairs`` (per-slot models step in pairs), ``donate``, ``horizon``;
        ``x``, ``y``: (shape, dtype) of one slot's input and target. The programs hold no
        state: every run takes the buffers and returns the new ones."""
        self.layout, self.fns, self.slots, self.n = layout, fns, slots, slots or 1
        self.per_slot, self.pairs, self.donate, self.horizon = per_slot, pairs, donate, horizon
        (self.x_shape, self.x_dtype), (self.out_shape, self.y_dtype) = x, y
        self._init_buffers = init_buffers
        # the buffers' shapes, to compile from: the buffers themselves may be donated (deleted)
        # by a step on the serving thread while another thread compiles (the engine's warm-up)
        self.avals = tuple(jax.ShapeDtypeStruct(b.shape, b.dtype) for b in init_buffers)
        self._compiled = {}
        # where compiled step programs may be loaded from and kept (load(name) / save(name,
        # compiled)): the engine's executable store (engine/executables.py), else None
        self.store = None
        self._compile_lock = threading.Lock()   # one thread traces and compiles at a time
        # the step traced once for all programs: jit caches its trace per argument shapes, so
        # every program (and the shape probes before their loops) reuses it (cold start)
        self._step = jax.jit(self.fns.step)
        self._pair = jax.jit(self._each_model)
        self._slot_shapes = None
        self._events = [k for k in EVENTS if any(name.startswith(k + ".") for name in self.layout.names)]

    # ---- the cache ----------------------------------------------------------------------
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

    @property
    def events(self) -> list:
        """The per-slot events a step's output vector ends with, in order (``EVENTS`` the
        learner has: "screen" for an outlier, "rollback" for a step undone)."""
        return list(self._events)

    def is_compiled(self, key) -> bool:
        return key in self._compiled

    def keys(self) -> list:
        """The keys of the programs compiled so far."""
        return list(self._compiled)

    # ---- the programs -------------------------------------------------------------------
    def step(self, k: int | None = None):
        """The AOT-compiled packed step (cached per micro-batch size)."""
        def build():
            x, y, a = self.example_inputs(k)
            return self.packed(self._fn(k), (x, y, a, a), self.options(self.n, loop=k is not None),
                               donate="alone" if self.donate else None, name=("step", k))
        return self._program(k, build)

    def subset(self, m: int, k: int = 1):
        """The AOT-compiled steps of m slots, up to k steps per call (see ``_fn_subset``).
        Its buffers are always donated: the m slots are written back in place."""
        if self.slots is None or not 1 <= m <= self.n or k < 1:
            raise ValueError(f"a subset step needs a learner with slots, 1 <= m <= {self.n} and k >= 1; "
                             f"got m={m}, k={k}")

        def build():
            x, y, a = self.example_inputs(k, m)
            return self.packed(self._fn_subset(), (np.zeros(m, np.int32), np.int32(1), x, y, a, a),
                               self.options(m, loop=True), donate="all", name=("subset", m, k))
        return self._program(("subset", m, k), build)

    def loop(self, k: int):
        """The AOT-compiled steps of all slots, up to k steps per call, their number given at
        run time (see ``_fn_loop``): one program for any micro-batch size."""
        if k < 1:
            raise ValueError(f"a loop step needs k >= 1; got k={k}")

        def build():
            x, y, a = self.example_inputs(k)
            return self.packed(self._fn_loop(), (np.int32(1), x, y, a, a), self.options(self.n, loop=True),
                               donate="alone" if self.donate else None, name=("loop", k))
        return self._program(("loop", k), build)

    def reset(self):
        """The compiled slot reset: (buffers, slot) -> buffers."""
        reset = self._fn_reset()
        return self._program("reset", lambda: jax.jit(reset).lower(self.avals, np.int32(0)).compile())

    def read_slot(self):
        """The compiled slot read: (buffers, slot) -> that slot's ``slot_part``."""
        def read(buffers, i):
            return jax.tree_util.tree_map(lambda a: a[i], self.slot_part(self.layout.unpack(buffers)))
        return self._program("read_slot", lambda: jax.jit(read).lower(self.avals, np.int32(0)).compile())

    def write_slot(self):
        """The compiled slot write: (buffers, slot, part) -> buffers."""
        def write(buffers, i, part):
            state = self.layout.unpack(buffers)
            new = jax.tree_util.tree_map(lambda a, b: a.at[i].set(b), self.slot_part(state), part)
            return self.layout.pack(self._with_slot_part(state, new))
        return self._program("write_slot", lambda: jax.jit(write).lower(self.avals, np.int32(0),
                                                                          self.slot_struct()).compile())

    def label(self):
        """The compiled label program (``Supervised(label_delay=d)``): (buffers, slot, age, y) ->
        (buffers, status, loss, applied); status 0: applied, else ``labels.LABEL_CODES`` and the
        state is unchanged. The buffers are donated (the ring is written in place), but for the
        fixed weights (a slot bank shares them between slots)."""
        def build():      # compiled once; the wrapper too (a label message calls it every time)
            f = self.layout.fixed_from
            run = self._fn_label()

            def split(changing, fixed, i, age, y):      # fixed weights neither donated nor returned
                buffers, *rest = run(changing + fixed, i, age, y)
                return (buffers[:f], *rest)
            compiled = jax.jit(split, donate_argnums=(0,)).lower(
                self.avals[:f], self.avals[f:], np.int32(0), np.int32(0),
                jax.ShapeDtypeStruct(self.out_shape, self.y_dtype)).compile()

            def call(buffers, i, age, y):
                out, *rest = compiled(buffers[:f], buffers[f:], i, age, y)
                return (out + buffers[f:], *rest)
            return call
        return self._program("label", build)

    def _fn_label(self):
        """The pure label program: (buffers, slot, age, y) -> (buffers, status, loss, applied)
        (``label``; also what ``streamtrace export`` compiles)."""
        def run(buffers, i, age, y):
            state = self.layout.unpack(buffers)
            if not self.per_slot:
                state, status, loss, applied = apply_label(self.fns, state, i, age, y)
                return self.layout.pack(state), status, loss, applied
            one = jax.tree_util.tree_map(lambda a: a[i], state)
            one, status, loss, applied = apply_label(self.fns, one, 0, age, y)
            # written back: what a label changes (not the slot's ring of gradients)
            # (an update of a slice, not a scatter, which IREE's CPU backend refuses here)
            put = lambda a, b: jax.tree_util.tree_map(lambda a, b: jax.lax.dynamic_update_index_in_dim(a, b, i, 0), a, b)
            moved = {k: put(state[k], one[k]) for k in MOVING if k in state}
            labels = {**state["labels"], "state": put(state["labels"]["state"], one["labels"]["state"])}
            return self.layout.pack({**state, **moved, "labels": labels}), status, loss, applied
        return run

    def _fn_predict(self):
        """The pure prediction twin of one step: (buffers, x, y, active, learn) -> the step's
        output vector, nothing written back (``predict(None)``; also what ``streamtrace export``
        compiles)."""
        return lambda b, x, y, a, l: self._steps(self.layout.unpack(b), None, x, y, a, l, update=False)[1]

    def _fn_reset(self):
        """The pure slot reset: (buffers, slot) -> buffers (``reset``; also exported)."""
        init = self._init_buffers

        def reset(buffers, i):
            state = self.layout.unpack(buffers)
            fresh = self.slot_part(self.layout.unpack(init))    # in the program: no eager ops
            row = lambda a, b: jax.lax.dynamic_update_index_in_dim(a, jax.lax.dynamic_index_in_dim(b, i, 0), i, 0)
            part = jax.tree_util.tree_map(row, self.slot_part(state), fresh)     # (not a scatter: IREE)
            return self.layout.pack(self._with_slot_part(state, part))
        return reset

    def predict(self, key=None):
        """The prediction-only twin of the program ``key`` (None: ``step()``, ("loop", k) or
        ("subset", m, k)), for calls of one step: the same inputs in the same packed buffer
        (views filled for one serve both), the same step code with no state written back, and
        the same output vector but for its applied flags (0). XLA keeps only what the
        prediction and the loss need (no gradient, no optimizer), so the answer can leave
        before the update runs (the engine's reply_first) and is the twin's, bit for bit
        (tests/engine/test_reply_first.py). No buffers donated: the twin runs next on the same ones."""
        def build():
            twin = self._twin(key)
            if key is None:
                fn, m = self._fn_predict(), self.n
            elif key[0] == "loop":
                fn = lambda b, count, xs, ys, a, l: self._loop_steps(self.layout.unpack(b), count, xs, ys, a, l,
                                                                     update=False)[1]
                m = self.n
            else:
                fn, m = self._predict_subset(), key[1]
            inputs = twin.inputs
            run = jax.jit(lambda buffers, io: fn(buffers, *inputs.unpack(io)))
            options = self.options(m, loop=key is not None)     # the twin's: the same scheduler
            return _Call(self._compile(("predict", key), lambda: run.lower(self.avals, inputs.buffer), options),
                         inputs, None)
        return self._program(("predict", key), build)

    def _twin(self, key):
        if key is None:
            return self.step()
        if key[0] == "loop":
            return self.loop(key[1])
        return self.subset(key[1], key[2])

    def _predict_subset(self):
        """``_fn_subset`` without its write-back: the m gathered slots' predictions."""
        rows = SlotRows(self.layout, self._slot_names(), self.n)

        def fn(buffers, idx, count, xs, ys, active, learn):
            state = self._gathered(rows, buffers, idx)
            return self._loop_steps(state, count, xs, ys, active, learn, update=False)[1]
        return fn

    def _gathered(self, rows, buffers, idx):
        """The named state with the slots ``idx`` gathered (one gather per packed buffer), the
        shared leaves as they are."""
        layout = self.layout
        got = rows.gather(buffers, idx)
        full = layout.treedef.flatten_up_to(layout.unpack(buffers))
        return jax.tree_util.tree_unflatten(layout.treedef, [got.get(k, v) for k, v in zip(layout.names, full)])

    def example_inputs(self, k, n=None):
        """Zero (x, y, active) of a call of k steps (None: one step) over n slots (all)."""
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

    # ---- runs (the engine's path: no validation) ---------------------------------------
    def run(self, buffers, x, y, active, learn, k: int | None = None):
        """Arrays already of the right shapes and dtypes (a leading k axis for k steps), no
        validation: (the new buffers, the raw output vector (see ``decode``))."""
        buffers, vec = self.step(k)(buffers, x, y, active, learn)
        return buffers, np.asarray(vec)

    def run_loop(self, buffers, count: int, xs, ys, active, learn):
        """For many busy slots: ``count`` steps of all slots; xs, ys, active, learn (K, N, ...)
        of which the first ``count`` are used (K: the compiled size, see ``loop``). Returns
        (the new buffers, (K, vector) rows); the first ``count`` rows are the steps'."""
        buffers, vecs = self.loop(len(xs))(buffers, np.int32(count), xs, ys, active, learn)
        return buffers, np.asarray(vecs)

    def run_subset(self, buffers, idx, count: int, xs, ys, active, learn):
        """For a few busy slots: ``count`` steps of slots ``idx`` (m,) int32, distinct; xs, ys,
        active, learn (K, m, ...) of which the first ``count`` are used (K: the compiled size,
        see ``subset``). Returns (the new buffers, (K, vector) rows); the first ``count`` rows
        are the steps' results (``decode(row, m=m)``)."""
        buffers, vecs = self.subset(len(idx), len(xs))(buffers, idx, np.int32(count), xs, ys, active, learn)
        return buffers, np.asarray(vecs)

    def run_predict(self, buffers, key, *inputs) -> np.ndarray:
        """``predict(key)`` on ``buffers`` (left as they are: nothing donated): its output vector."""
        return np.asarray(self.predict(key)(buffers, *inputs))

    def decode(self, vec, k: int | None = None, m: int | None = None) -> list[StepResult] | StepResult:
        """Split ``run``'s vector into StepResults (a list when k is given); m: the slot count
        of a subset step."""
        return self._decode(vec, m) if k is None else [self._decode(v, m) for v in vec.reshape(k, -1)]

    def _decode(self, vec, n: int | None = None) -> StepResult:
        n = n or self.n
        one = self.out_shape if self.horizon == 1 else (self.horizon,) + self.out_shape
        pred_shape = one if self.slots is None else (n,) + one
        n_out = math.prod(pred_shape)
        pred = vec[:n_out].reshape(pred_shape)
        loss = vec[n_out:n_out + n]
        n_applied = n if self.per_slot else 1
        applied = vec[n_out + n:n_out + n + n_applied] > 0.5
        flags = vec[n_out + n + n_applied:].reshape(-1, n) > 0.5
        events = {k: (f if self.slots is not None else bool(f[0])) for k, f in zip(self._events, flags)}
        return StepResult(pred, loss, applied if self.per_slot else bool(applied[0]),
                          outlier=events.get("screen", False), rolled_back=events.get("rollback", False))

    # ---- a slot's part of the state -----------------------------------------------------
    def slot_part(self, state) -> dict:
        """The leaves of ``state`` that belong to the slots (slot axis first): everything with
        per-slot weights; otherwise hidden state, traces, pending input, the signal transform's
        statistics, the readout and the per-slot loss and rolling metrics. One definition for
        ``reset`` and for ``read_slot`` / ``write_slot`` (the engine's parking)."""
        if self.per_slot:
            return state
        part = {k: state[k] for k in ("hidden", "traces", "pending", "signal", "readout", "combine", "labels",
                                      "screen", "rollback") if k in state}
        part["stats"] = {k: state["stats"][k] for k in ("preq_sum", "preq_n", "roll")}
        return part

    def _with_slot_part(self, state, part) -> dict:
        """``state`` with its slot leaves replaced by ``part`` (a ``slot_part``)."""
        if self.per_slot:
            return part
        return {**state, **{k: v for k, v in part.items() if k != "stats"},
                "stats": {**state["stats"], **part["stats"]}}

    def slot_struct(self):
        """One slot's part as shapes (traced once)."""
        if self._slot_shapes is None:
            self._slot_shapes = jax.eval_shape(lambda b: jax.tree_util.tree_map(
                lambda a: a[0], self.slot_part(self.layout.unpack(b))), self.avals)
        return self._slot_shapes

    def _slot_names(self) -> list[str]:
        """The names of the per-slot leaves (``slot_part`` of the state with its names as leaves)."""
        return jax.tree_util.tree_leaves(self.slot_part(jax.tree_util.tree_unflatten(
            self.layout.treedef, list(self.layout.names))))

    # ---- the step's computation ---------------------------------------------------------
    def _core(self, state, x, y, active, learn, update=True):
        """One step on named state; x/y/active/learn carry the slot axis (size N). ``update``
        False: a predict program's step (``predict``), which writes no pair's state back."""
        if not self.per_slot:
            return self._step(state, x, y, active, learn)
        if self.pairs:
            return self._in_pairs(state, x, y, active, learn, update)
        return self.each_model(state, x, y, active, learn)

    def each_model(self, s, x, y, a, l):
        """The given slots' steps, a model each, vmapped over them (a pair in ``_in_pairs``)."""
        return self._pair(s, x, y, a, l)

    def _each_model(self, s, x, y, a, l):
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

    def _in_pairs(self, state, x, y, active, learn, update=True):
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
                                                       grow(active, False), grow(learn, False), update)
            return jax.tree_util.tree_map(lambda v: v[:n], state), out[:n], loss[:n], applied[:n]
        part = lambda tree, j: jax.tree_util.tree_map(lambda v: jax.lax.dynamic_slice_in_dim(v, j * c, c, 0), tree)
        ring = PairRing(state, c)
        like = jax.eval_shape(self.each_model, ring.part(state, 0, part), x[:c], y[:c], active[:c], learn[:c])[1:]
        outs = tuple(jnp.zeros((n,) + v.shape[1:], v.dtype) for v in like)

        def body(j, carry):
            state, outs = carry
            args = (ring.part(state, j, part), part(x, j), part(y, j), part(active, j), part(learn, j))
            s, *got = jax.lax.cond(jnp.any(args[3]), lambda a: self.each_model(*a),
                                   lambda a: self._idle_pair(a[0], like), args)
            put = lambda v, u: jax.lax.dynamic_update_slice_in_dim(v, u, j * c, 0)
            state = ring.put(state, s, j, args[0], put) if update else state
            return state, tuple(put(o, g) for o, g in zip(outs, got))
        pairs = jax.lax.optimization_barrier(jnp.int32(n // c))
        state, (out, loss, applied) = jax.lax.fori_loop(0, pairs, body, (state, outs))
        return state, out, loss, applied

    def pack_out(self, out, loss, applied, events=()):
        """A step's prediction, loss, applied flags and per-slot events (``EVENTS``: outlier,
        rolled back; those the learner has) as one output vector (see ``decode``)."""
        dt = jnp.result_type(out.dtype, jnp.float32)
        return jnp.concatenate([jnp.ravel(out).astype(dt), loss.astype(dt), jnp.ravel(applied).astype(dt),
                                *(jnp.ravel(e).astype(dt) for e in events)])

    def _fn(self, k: int | None):
        """The pure packed step: (buffers, x, y, active, learn) -> (buffers, out vector).
        k=None: one step, gated on the buffers it returns (rollback.gate_buffers: the cheap
        place); k: a scan over k pending steps (micro-batching), each step gated."""
        layout = self.layout

        def fn(buffers, x, y, active, learn):
            if k is not None:
                state, vec = self._steps(layout.unpack(buffers), k, x, y, active, learn)
                return layout.pack(state), vec
            new, out, loss, applied, events = self._one(layout.unpack(buffers), x, y, active, learn, True)
            packed, undone = gate_buffers(layout, buffers, layout.pack(new), active)
            return packed, self._vec(out, loss, applied, events, undone)
        return fn

    def _one(self, state, x, y, active, learn, update):
        """One step, ungated: (new state, prediction, loss, applied, {event: per slot})."""
        if self.slots is None:
            x, y = x[None], y[None]
        new, out, loss, applied = self._core(state, x, y, active, learn, update)
        events = {k: new[k]["now"] for k in EVENTS if k in new and k != "rollback"}
        return new, (out[0] if self.slots is None else out), loss, applied, events

    def _vec(self, out, loss, applied, events, undone):
        """The output vector of one step whose slots ``undone`` (N,) were rolled back."""
        loss = jnp.where(undone > 0, jnp.nan, loss)
        applied = applied & (undone == 0 if self.per_slot else ~jnp.any(undone > 0))
        events = {**events, "rollback": undone}
        return self.pack_out(out, loss, applied, [events[k] for k in self._events])

    def _steps(self, state, k, x, y, active, learn, update=True):
        """``update`` False: the prediction and loss only, the state returned as it came
        (``predict``): XLA then drops the gradient, the traces' and the optimizer's work.
        Every step is gated (a step that left a non-finite value is undone, learner/rollback.py)."""
        def single(state, x, y, active, learn):
            new, out, loss, applied, events = self._one(state, x, y, active, learn, update)
            if update:
                new, undone = gate(self.layout, state, new, active)
            else:
                new, applied, undone = state, jnp.zeros_like(applied), jnp.zeros(active.shape, jnp.int32)
            return new, self._vec(out, loss, applied, events, undone)
        if k is None:
            return single(state, x, y, active, learn)
        state, vecs = jax.lax.scan(lambda s, xs: single(s, *xs), state, (x, y, active, learn))
        return state, jnp.ravel(vecs)

    def _loop_steps(self, state, count, xs, ys, active, learn, update=True):
        """The first ``count`` of the K steps in xs (K, slots, ...): (state, (K, vector))."""
        one = jax.eval_shape(lambda s: self._steps(s, None, xs[0], ys[0], active[0], learn[0])[1], state)
        vecs = jnp.zeros((xs.shape[0],) + one.shape, one.dtype)

        def body(i, carry):
            state, vecs = carry
            state, vec = self._steps(state, None, xs[i], ys[i], active[i], learn[i], update)
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
        full step with only those slots active (tests/learner/test_slot_subset.py)."""
        layout, n = self.layout, self.n
        rows = SlotRows(layout, self._slot_names(), n)

        def fn(buffers, idx, count, xs, ys, active, learn):
            state = self._gathered(rows, buffers, idx)
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

    # ---- compiling ----------------------------------------------------------------------
    def options(self, slots, loop):
        """The XLA options of a step program over ``slots`` slots (learner/xla_options.py)."""
        return step_compiler_options(slots, leaf_guards=self.fns.opt is not None and not self.fns.in_place, loop=loop)

    def _compile(self, name, lower, options):
        """``lower()`` compiled with ``options``, or through the store (the program stored as
        ``name``, then nothing is traced; else compiled and stored). No name: never stored."""
        if self.store is not None and name is not None:
            return self.store.compile(name, lower, options)
        return lower().compile(options)

    def packed(self, fn, args, options, donate: str | None, name=None):
        """``fn(buffers, *args)`` compiled as a ``_Call`` whose args cross as one packed buffer.
        ``donate``: None, "all" buffers, or "alone": the standalone buffers (weights, moments,
        traces, an RLS matrix) but not the few packed small ones. XLA reads and rewrites those in
        one program, so donated it copies them first, and the copy reorders a small step
        (measured: docs/decisions/step-details.md). ``name``: the program's name in the store."""
        inputs = PackedInputs(args)
        if donate == "all":
            cut = None
            run = jax.jit(lambda buffers, io: fn(buffers, *inputs.unpack(io)), donate_argnums=(0,))
            lower = lambda: run.lower(self.avals, inputs.buffer)
        else:
            cut = n, f = len(self.layout.dtypes), self.layout.fixed_from

            def split(small, alone, fixed, io):     # fixed weights in, not out (see _Call)
                buffers, *rest = fn(small + alone + fixed, *inputs.unpack(io))
                return (buffers[:f], *rest)
            run = jax.jit(split, donate_argnums=(1,) if donate == "alone" else ())
            lower = lambda: run.lower(self.avals[:n], self.avals[n:f], self.avals[f:], inputs.buffer)
        return _Call(self._compile(name and (name, donate), lower, options), inputs, cut)
