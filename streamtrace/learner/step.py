"""The learner's pure step functions over a named state tree.

State layout (a dict; every leaf has a stable name once flattened, e.g. ``hidden.cell.h``):

    params, opt, acc   the weights as one packed (rows, width) block, the optimizer state
                       over that block, summed gradients (learn-every-k); ``ParamBlock``
                       names every row range, so checkpoints and ``state_dict`` stay readable
    hidden, traces     per slot (leading axis N)
    pending            forecast mode: the last input x_{t-1}, whether it is valid, and the
                       prediction made from it (user units, for the rolling metrics)
    signal, readout    the signal transform's statistics and the closed-form readout (per slot)
    stats              counters [step, updates, skipped, rejected, since_update], the per-slot
                       prequential loss sum and count, and the rolling metrics (``roll``)

One block instead of one array per weight: the optimizer then runs as a couple of fused
kernels rather than a few per weight, and each kernel has a fixed cost on a small CPU
(measured: docs/decisions/step-details.md).
With parameter groups ``params`` is one block per group. Shared weights: one ``params`` for all N slots; per-slot weights: every leaf gets a leading
slot axis and the shared step runs under ``vmap`` with one slot each.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

from .adam import clipped
from .barriers import hold
from .groups import SEPARATE_FROM, ParamStore
from .optimizers import OptimizerParts
from .rolling import RollingMetrics
from .transforms import Identity

__all__ = ["StepConfig", "StepFunctions", "MODES", "COUNTERS"]

MODES = ("supervised", "forecast", "predict")
COUNTERS = ("step", "updates", "skipped", "rejected", "since_update")
_C = {n: i for i, n in enumerate(COUNTERS)}



@dataclass(frozen=True)
class StepConfig:
    mode: str = "supervised"
    learn_every: int = 1
    reduce: str = "mean"       # how slot losses combine with shared weights
    channels: tuple | None = None   # forecast: the input channels predicted (None: all)
    horizon: int = 1                # forecast: predictions of the next `horizon` values
    window: int = 1000              # rolling metrics time constant (steps)
    label_delay: int = 0            # supervised: targets may come up to label_delay - 1 steps late (labels.py)
    before_update: bool = False     # forecast: predict with the weights from before this step's update


def _lead(ok, a):
    return ok.reshape(ok.shape + (1,) * (a.ndim - ok.ndim))


def _slot_where(ok, new, old):
    """Per-slot select: ok (N,) against leaves with a leading slot axis."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(_lead(ok, a), a, b), new, old)


def _ones_dot(x):
    """Sum of x's trailing axes as a product with ones (x: (N, ...) -> (N,)). XLA's CPU backend
    rewrites a float sum into a windowed reduction that took as long as the whole trace update
    (measured: docs/decisions/step-details.md); a matrix-vector product with ones is one pass
    at memory speed, with the same NaN / inf propagation.
    One slot: XLA turns a (1, K) product back into a reduction, so the rows of the slot are
    summed by the product and only their few row sums by a reduction."""
    n = x.shape[0]
    if n > 1 or x.ndim < 3:
        return _row_sums(x.reshape(n, -1))
    rows = x.reshape(-1, x.shape[-1] if x.shape[-1] > 1 else x.shape[-2] * x.shape[-1])
    return jnp.sum(_row_sums(rows)).reshape(1)


@jax.custom_batching.custom_vmap
def _row_sums(a):
    """(R, C) -> (R,): ``a @ ones``."""
    return a @ jnp.ones(a.shape[-1], a.dtype)


@_row_sums.def_vmap
def _row_sums_vmap(axis_size, in_batched, a):
    """Under vmap (a model per slot) the ones get the slot axis too, so the product keeps it
    as a batch axis. With plain vmap the slot axis was folded into the rows, a reshape after
    which XLA assembled the whole gradient block a second time just for the check (a slower
    step and subset call, measured: docs/decisions/step-details.md). Without vmap the program
    is the same as before."""
    if not in_batched[0]:
        return _row_sums(a), False
    return jnp.einsum("brc,bc->br", a, jnp.ones((axis_size, a.shape[-1]), a.dtype)), True


def _small_traces(tr):
    """The trace arrays of under 4,096 values per slot (ES-D-RTRL's, elementwise weights').
    The traces are guarded inside the step (always finite), but a step that reads these
    small ones once has XLA keep them in memory; unread, it recomputed them inside every
    element of the weight-sized gradient and Adam loops (GRU-256 ES-D-RTRL, one slot: 1.65x
    the limit program against 1.26x). The big ones are left unread: a read is a full pass."""
    return {k: v for k, v in tr.items() if v[0].size < 4096}


# gradient arrays under this many values are checked whole (see _check_gradient): the size
# from which a weight is stored as an array of its own
CHECK_BELOW = SEPARATE_FROM


def _check_gradient(grads, frozen=()):
    """(grads, finite): whether every gradient array under CHECK_BELOW values is finite (if
    none is that small, the smallest one), so that a step whose gradient is not finite is
    refused whole and counted. The check reads those arrays, held in memory by the barrier:
    without it XLA evaluates each weight's gradient expression again for the check (per-slot
    products, slots x I x O, materialised instead of fused into the sum over slots). Bigger
    arrays (GRU-256's weights) are not read, a read being a full pass over a weight-sized
    array (GRU-256 ES-D-RTRL, one slot: 1.27x the limit program with it, 1.19x without);
    their values are guarded one by one in the update instead (``_keep_finite``).
    ``frozen``: the groups (top-level keys) whose gradient is zero by construction, left
    unread: the barrier would have XLA build their zeros and sum them every step (for a frozen
    reservoir weight, a sizeable part of the step)."""
    if frozen:
        fixed = {g: grads[g] for g in frozen}
        rest, finite = _check_gradient({g: v for g, v in grads.items() if g not in fixed})
        return {**rest, **fixed}, finite
    flat, tree = jax.tree_util.tree_flatten(grads)
    if not flat:
        return grads, jnp.bool_(True)
    small = [i for i, g in enumerate(flat) if g.size < CHECK_BELOW] or \
        [min(range(len(flat)), key=lambda i: flat[i].size)]
    held = hold([flat[i] for i in small])
    for i, g in zip(small, held):
        flat[i] = g
    total = sum((jnp.sum(_ones_dot(g[None])) for g in held), jnp.zeros((), jnp.float32))
    return jax.tree_util.tree_unflatten(tree, flat), jnp.isfinite(total)


def _keep_finite(use, new, old):
    """``new`` where ``use`` and the value is finite, else ``old``: per value, in the pass that
    computes ``new`` (a value of a big weight whose gradient was not checked, or whose update
    overflowed, keeps its old value, and so do its optimizer moments)."""
    def one(u, v):
        if jnp.issubdtype(u.dtype, jnp.inexact):
            return jnp.where(use & jnp.isfinite(u), u, v)
        return jnp.where(use, u, v)
    return jax.tree_util.tree_map(one, new, old)


def _carried_finite(h, tr):
    """(N,) whether each slot's new hidden state (and its small traces, see above) is finite.
    Steps of many slots sharing weights read the small traces too, though their gradient (a
    product summed over the slots) reads them from memory anyway: without the read such a
    step was faster, but on jax 0.12 a micro-batched call then rounded differently from single
    steps (an RLS readout's P moved by 4e-4 over 24 steps; bit-identical with the read), so the
    read stays (measured: docs/decisions/step-details.md)."""
    return jnp.isfinite(_slot_sum(h) + _slot_sum(_small_traces(tr)))


def _slot_sum(tree):
    """(N,) sum of every value of each slot: finite iff all of them are (or it overflowed,
    which we also refuse). Integer leaves are always finite and are left out."""
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return sum(_ones_dot(x) for x in leaves) if leaves else 0.0


class StepFunctions:
    """Builds ``step(state, x, target, active, learn) -> (state, prediction, loss, applied)``
    for N slots sharing one set of weights; x/target carry the slot axis. ``active`` (N,):
    the slot advances this step; ``learn`` (N,): it also contributes to the weight update.

    ``transform`` (signal transforms, e.g. normalise + residual) sits between the user's units
    and the model; ``readout`` (e.g. RLS) maps the model's output features to the prediction.
    ``optimizer`` (learner/optimizers.py): frozen, the model's weights never change (a fixed
    reservoir), so no traces are kept and no gradient is taken; only the readout and the
    transforms learn. Otherwise an optax transform or parameter groups, behind a clip.
    """

    def __init__(self, algo, loss_fn, optimizer: OptimizerParts, cfg: StepConfig, *, transform=None,
                 readout=None, y_shape=None, combine=None):
        if cfg.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {cfg.mode!r}")
        if cfg.learn_every < 1:
            raise ValueError(f"learn_every must be >= 1; got {cfg.learn_every}")
        if cfg.reduce not in ("mean", "sum"):
            raise ValueError(f"reduce must be 'mean' or 'sum'; got {cfg.reduce!r}")
        self.algo, self.loss_fn, self.cfg = algo, loss_fn, cfg
        # forecast of all channels: the target is the whole next input
        channels = cfg.channels if cfg.mode != "forecast" or cfg.channels else slice(None)
        self.transform = (transform or Identity()).bind(channels)
        self.readout = readout
        self.combine = combine      # e.g. experts(): the prediction a user gets (see experts.py)
        self.learn_model = not optimizer.frozen
        self.store = ParamStore(algo.graph.init_params(), optimizer.groups, separate=not self.learn_model)
        opt = self.store.optimizer(optimizer.base) if self.learn_model else None
        if opt is not None and optimizer.clip is not None:
            opt = clipped(optimizer.clip, opt)    # Adam behind a clip: still in place
        self.opt = opt
        # the optimizer updates each value in one guarded pass (learner.adam) instead of a
        # select per state leaf after it: buffers can then be donated (see OnlineLearner)
        self.in_place = hasattr(opt, "guarded_step") and cfg.learn_every == 1
        self._y_shape = tuple(y_shape) if y_shape is not None else tuple(algo.graph.out_struct.shape)
        self.rolling = RollingMetrics(cfg.window)
        # a frozen model under a readout needs no replay of step t-1 (there is no gradient to
        # take): the features of the last prediction are kept instead, one model step per call
        self._carry_features = cfg.mode == "forecast" and readout is not None and not self.learn_model
        self._vstep = algo.over_slots
        self._vforward = jax.vmap(lambda p, h, tr, x, k: algo.forward(p, h, tr, (x,), k), in_axes=(None, 0, 0, 0, 0))
        self._vplain = jax.vmap(lambda p, h, x: algo.graph.run(p, h, (x,)), in_axes=(None, 0, 0))

    # ---- params as one block (or one per group) ------------------------------------------
    def to_block(self, params: dict):
        return self.store.pack(params)

    def from_block(self, block) -> dict:
        return self.store.unpack(block)

    # ---- state ------------------------------------------------------------------------
    def init(self, n_slots: int, x_shape, x_dtype, params=None, y_shape=None, y_dtype=None) -> dict:
        p0, h0, tr0 = self.algo.init_state()
        block = self.to_block(p0 if params is None else params)
        tile = lambda t: jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (n_slots,) + v.shape), t)
        y_shape = tuple(y_shape) if y_shape is not None else self._y_shape
        n_out = math.prod(y_shape)
        state = {"params": block, "hidden": tile(h0), "traces": tile(tr0) if self.learn_model else {},
                 "stats": {"counters": jnp.zeros(len(COUNTERS), jnp.int32),
                           "preq_sum": jnp.zeros(n_slots, jnp.float32),
                           "preq_n": jnp.zeros(n_slots, jnp.int32),
                           "roll": self.rolling.init(n_slots, n_out, jnp.result_type(float))}}
        if self.learn_model:
            state["opt"] = self.opt.init(block)
            if self.cfg.learn_every > 1:
                state["acc"] = jax.tree_util.tree_map(jnp.zeros_like, block)
        if self.cfg.mode == "forecast":
            state["pending"] = {"x": jnp.zeros((n_slots,) + tuple(x_shape), x_dtype),
                                "valid": jnp.zeros(n_slots, jnp.int32),
                                "pred": jnp.zeros((n_slots,) + y_shape, y_dtype or x_dtype)}
        if self.combine is not None:
            state["combine"] = self.combine.init(n_slots, n_out, y_dtype or x_dtype)
        sig = self.transform.init(n_slots, tuple(x_shape), y_shape)
        if sig:
            state["signal"] = sig
        if self.readout is not None:
            feat = self.algo.graph.out_struct
            z = jax.eval_shape(self.transform.encode, sig, jax.ShapeDtypeStruct((n_slots,) + tuple(x_shape), x_dtype))
            n_in = math.prod(z.shape[1:])       # the encoded input (feedback widens it)
            n_feat = math.prod(feat.shape)
            state["readout"] = self.readout.init(n_slots, n_feat, n_in, n_out, feat.dtype)
            if self._carry_features:
                m = self.readout.n_features(n_feat, n_in)
                state["pending"]["r"] = jnp.zeros((n_slots, m), feat.dtype)
        return state

    # ---- the step ---------------------------------------------------------------------
    def step(self, state, x, target, active, learn):
        mode = self.cfg.mode
        if mode == "predict":
            return self._predict(state, x, active)
        if mode == "forecast":
            return self._forecast(state, x, active, learn)
        return self._supervised(state, x, target, active, learn)

    def _weighted(self, losses, learning):
        """Sum or mean of the slot losses that learn and are finite; a slot whose loss
        overflowed contributes nothing (its gradient never reaches the shared weights)."""
        use = learning & jax.lax.stop_gradient(jnp.isfinite(losses))
        w = use / jnp.maximum(jnp.sum(use), 1) if self.cfg.reduce == "mean" else use.astype(losses.dtype)
        return jnp.sum(jnp.where(use, w * losses, 0.0))

    def _run(self, total, state):
        """total(params dict) -> (loss, aux); its gradient w.r.t. the stored weights when the
        model learns, else just aux (no gradient is taken for a frozen model)."""
        if not self.learn_model:
            return total(self.from_block(state["params"]))[1], None
        # differentiate w.r.t. the named weights and pack their gradients: the gradient of the
        # block itself would be a sum of one zero-padded block per weight, which XLA fuses into
        # a loop that evaluates every weight's gradient at every element (a third of a GRU-256
        # step; measured: docs/decisions/step-details.md)
        (_, aux), g = jax.value_and_grad(total, has_aux=True)(self.from_block(state["params"]))
        return aux, self.to_block(g)

    def _model(self, p, state, z, learn: bool, keep=None):
        """The model on encoded input z from the stored hidden state: (out, hidden, traces).
        ``keep`` (N,): the slots whose traces advance (the others keep theirs)."""
        if learn and self.learn_model:
            return self._vstep(p, state["hidden"], state["traces"], z, keep)
        out, h = self._vplain(p, state["hidden"], z)
        return out, h, state["traces"]

    def _head(self, state, out, z):
        """Model output -> model-space prediction (through the readout, its weights held)."""
        if self.readout is None:
            return out, None
        r = self.readout.features(out, z)
        held = jax.tree_util.tree_map(jax.lax.stop_gradient, state["readout"])
        return self.readout.predict(held, r).reshape((out.shape[0],) + self._y_shape), r

    def _feed_back(self, x, pred):
        """The next input of a rollout: the prediction in the forecast channels, the other
        (exogenous) channels held at their last value."""
        pred = pred.astype(x.dtype)
        return pred if self.cfg.channels is None else x.at[..., self.cfg.channels].set(pred)

    def _learn_readout(self, state, r, t_model, learning):
        if self.readout is None:
            return state
        rs, _ = self.readout.update(state["readout"], r, t_model, learning)
        return {**state, "readout": rs}

    def _count(self, counters, **inc):
        # a one-hot add, not ``counters.at[i].add``: IREE's CPU backend refuses that scatter
        # inside a conditional (the label program, ``streamtrace export``); the same integers
        rows = jnp.arange(counters.shape[0]).reshape((-1,) + (1,) * (counters.ndim - 1))
        for name, v in inc.items():
            counters = counters + jnp.where(rows == _C[name], jnp.asarray(v, jnp.int32), 0)
        return counters

    def _apply(self, state, grads, any_ok):
        """Optimizer step (or accumulation), refused when the gradient is not finite."""
        if not self.learn_model:
            return state, jnp.bool_(False)
        counters = state["stats"]["counters"]
        grads, finite = _check_gradient(grads, self.store.frozen)
        use = any_ok & finite
        counters = self._count(counters, rejected=any_ok & ~finite)
        params, opt = state["params"], state["opt"]
        k = self.cfg.learn_every
        new = dict(state)
        keep = lambda a, b: _keep_finite(use, a, b)
        if self.in_place:
            new["params"], new["opt"] = self.opt.guarded_step(grads, opt, params, use)
            applied = use
        elif k == 1:
            updates, opt2 = self.opt.update(grads, opt, params)
            new["params"] = keep(optax.apply_updates(params, updates), params)
            new["opt"] = keep(opt2, opt)
            applied = use
        else:
            acc = keep(jax.tree_util.tree_map(jnp.add, state["acc"], grads), state["acc"])
            since = counters[_C["since_update"]] + use.astype(jnp.int32)
            applied = since >= k

            def do(args):
                params, opt, acc = args
                updates, opt2 = self.opt.update(acc, opt, params)
                return (_keep_finite(True, optax.apply_updates(params, updates), params),
                        _keep_finite(True, opt2, opt), jax.tree_util.tree_map(jnp.zeros_like, acc))
            new["params"], new["opt"], new["acc"] = jax.lax.cond(applied, do, lambda a: a, (params, opt, acc))
            counters = counters.at[_C["since_update"]].set(jnp.where(applied, 0, since))
        if self.store.frozen:    # frozen groups as they came: their update adds zeros (unused: not computed)
            new["params"] = {**new["params"], **{g: params[g] for g in self.store.frozen}}
        counters = self._count(counters, updates=applied)
        new["stats"] = {**state["stats"], "counters": counters}
        return new, applied

    def _finish(self, state, skipped, scored, losses, pred=None, target=None, measured=None):
        """Count the step, the skipped slots, and the prequential loss of the scored ones;
        the rolling metrics score ``pred`` against ``target`` (user units) where ``measured``."""
        stats = dict(state["stats"])
        stats["counters"] = self._count(stats["counters"], step=1, skipped=jnp.sum(skipped))
        stats["preq_sum"] = stats["preq_sum"] + jnp.where(scored, losses, 0.0).astype(jnp.float32)
        stats["preq_n"] = stats["preq_n"] + scored.astype(jnp.int32)
        if pred is not None:
            stats["roll"] = self.rolling.update(stats["roll"], pred, target, measured)
        return {**state, "stats": stats}

    def _signal(self, state):
        return state.get("signal", {})

    def _observe(self, state, x, y, ok):
        if "signal" not in state:
            return state
        return {**state, "signal": self.transform.observe(state["signal"], x, y, ok)}

    def _supervised(self, state, x, target, active, learn):
        x_ok = active & jnp.isfinite(_slot_sum(x))
        ok = x_ok & (jnp.isfinite(_slot_sum(target)) | ~learn)
        sig, T = self._signal(state), self.transform
        learning = ok & learn
        # a bad slot's numbers must not reach the summed gradient, not even as 0 * NaN
        x, target = jnp.where(_lead(ok, x), x, 0), jnp.where(_lead(learning, target), target, 0)
        settled = T.ready(sig)
        z, t_model = T.encode(sig, x), T.target(sig, x, target)

        def total(p):
            out, h, tr = self._model(p, state, z, learn=True, keep=ok)
            pred, r = self._head(state, out, z)
            losses = jax.vmap(self.loss_fn)(pred, t_model)
            return self._weighted(losses, learning & settled), (pred, r, h, tr, losses)
        (pred, r, h, tr, losses), grads = self._run(total, state)
        ok = ok & _carried_finite(h, tr) & (jnp.isfinite(losses) | ~learning)
        observe = learning & ok     # the transform learns its statistics from every good sample
        learning = observe & settled
        out = T.decode(sig, x, pred)
        if self.combine is not None:
            cs, out = self.combine.supervised(state["combine"], out, target, observe)
            state = {**state, "combine": cs}
        # traces: guarded inside the step (see _model)
        state = {**state, "hidden": _slot_where(ok, h, state["hidden"]), "traces": tr}
        state = self._learn_readout(state, r, t_model, learning)
        state, applied = self._apply(state, grads, jnp.any(learning))
        state = self._observe(state, x, target, observe)
        losses = self._reported(losses, out, target)
        state = self._finish(state, active & ~ok, learning, losses, out, target, observe)
        return state, out, jnp.where(learning, losses, jnp.nan), applied

    def _forecast(self, state, x, active, learn):
        if self._carry_features:
            return self._forecast_carried(state, x, active, learn)
        return self._forecast_replayed(state, x, active, learn)

    def _forecast_carried(self, state, x, active, learn):
        """Frozen model + readout: ``hidden`` is the state after the last prediction and
        ``pending.r`` its readout features; learn the readout from them, then step once."""
        pend, T = state["pending"], self.transform
        sig = self._signal(state)
        x_ok = active & jnp.isfinite(_slot_sum(x))
        has_prev = x_ok & (pend["valid"] > 0)
        x = jnp.where(_lead(x_ok, x), x, 0)
        y_now = x if self.cfg.channels is None else x[..., self.cfg.channels]
        t_model = T.target(sig, pend["x"], y_now)
        pred_m = self.readout.predict(state["readout"], pend["r"]).reshape(t_model.shape)
        losses = jax.vmap(self.loss_fn)(pred_m, t_model)
        learning = has_prev & learn & T.ready(sig) & jnp.isfinite(losses)
        before = state
        state = self._learn_readout(state, pend["r"], t_model, learning)
        state = self._observe(state, x, None, x_ok)
        sig = self._signal(state)
        params = self.from_block(state["params"])
        z = T.encode(sig, x)
        out, h = self._vplain(params, state["hidden"], z)
        keep = x_ok & jnp.isfinite(_slot_sum(h))
        pred_m, r = self._head(self._predicting(state, before), out, z)
        preds = self._rollout(self._predicting(state, before), h, x, T.decode(sig, x, pred_m))
        state, preds = self._combined(state, y_now, has_prev, x_ok, preds, keep)
        losses = self._reported(losses, pend["pred"], y_now)
        state = self._finish(state, active & ~keep, learning, losses, pend["pred"], y_now, has_prev)
        state = {**state, "hidden": _slot_where(keep, h, state["hidden"]),
                 "pending": {"x": jnp.where(_lead(keep, x), x, pend["x"]),
                             "valid": jnp.where(keep, 1, pend["valid"]).astype(jnp.int32),
                             "pred": jnp.where(_lead(keep, preds[0]), preds[0], pend["pred"]),
                             "r": jnp.where(_lead(keep, r), r, pend["r"])}}
        pred = preds[0] if self.cfg.horizon == 1 else jnp.stack(preds, axis=1)
        return state, pred, jnp.where(learning, losses, jnp.nan), jnp.bool_(False)

    def _forecast_replayed(self, state, x, active, learn):
        """Learn from the prediction made at t-1 (its target is x_t), then predict x_{t+1}.

        The state holds where step t-1 began (hidden, traces, x_{t-1}); replaying that step
        under the custom VJP gives the online gradient of the t-1 prediction and the state
        at t-1, from which the next prediction is made with the updated weights.
        """
        pend, T = state["pending"], self.transform
        sig = self._signal(state)
        x_ok = active & jnp.isfinite(_slot_sum(x))
        has_prev = x_ok & (pend["valid"] > 0)
        learning = has_prev & learn & T.ready(sig)
        x = jnp.where(_lead(x_ok, x), x, 0)
        y_now = x if self.cfg.channels is None else x[..., self.cfg.channels]
        z_prev, t_model = T.encode(sig, pend["x"]), T.target(sig, pend["x"], y_now)

        def total(p):
            out, h, tr = self._model(p, state, z_prev, learn=True, keep=has_prev)
            pred, r = self._head(state, out, z_prev)
            losses = jax.vmap(self.loss_fn)(pred, t_model)
            return self._weighted(losses, learning), (h, tr, r, losses)
        (h1, tr1, r, losses), grads = self._run(total, state)
        advance = has_prev & _carried_finite(h1, tr1)
        learning = learning & advance & jnp.isfinite(losses)
        before = state
        state = self._learn_readout(state, r, t_model, learning)
        state, applied = self._apply(state, grads, jnp.any(learning))
        # the state at t-1 (replayed), or the held one where there was nothing to replay
        h_cur = _slot_where(advance, h1, state["hidden"])
        keep = x_ok & (advance | ~has_prev)
        state = self._observe(state, x, None, keep)
        preds = self._rollout(self._predicting(state, before), h_cur, x)
        state, preds = self._combined(state, y_now, advance, keep, preds, keep)
        losses = self._reported(losses, pend["pred"], y_now)
        state = self._finish(state, active & ~keep, learning, losses, pend["pred"], y_now, advance)
        # traces: guarded inside the step (where there was nothing to replay they are the old)
        state = {**state, "hidden": _slot_where(keep, h_cur, state["hidden"]), "traces": tr1,
                 "pending": {"x": jnp.where(_lead(keep, x), x, pend["x"]),
                             "valid": jnp.where(keep, 1, pend["valid"]).astype(jnp.int32),
                             "pred": jnp.where(_lead(keep, preds[0]), preds[0], pend["pred"])}}
        pred = preds[0] if self.cfg.horizon == 1 else jnp.stack(preds, axis=1)
        return state, pred, jnp.where(learning, losses, jnp.nan), applied

    def _predicting(self, state, before):
        """The state a forecast is made from: ``state``, or (``before_update``) ``state`` with
        the weights of ``before``, the state before this step's update (model and readout):
        the prediction then needs none of the update's work and may leave before it runs."""
        if not self.cfg.before_update:
            return state
        return {**state, **{k: before[k] for k in ("params", "readout") if k in before}}

    def _reported(self, losses, pred, target):
        """The per-slot loss a step reports (replies, stats): of the prediction the user got, in
        the user's units. Without transforms or a combiner that is the model's own loss."""
        if isinstance(self.transform, Identity) and self.combine is None:
            return losses
        return jax.vmap(self.loss_fn)(pred, target.astype(pred.dtype)).astype(losses.dtype)

    def _combined(self, state, y_now, scored, seen, preds, keep):
        """Forecast: the combiner scores the pending forecasts on y_now and mixes the next ones
        (a horizon's leads by learner/lead_experts.py)."""
        if self.combine is None:
            return state, preds
        if self.cfg.horizon > 1:
            cs, mixed = self.combine.forecast_leads(state["combine"], y_now, scored, seen, preds, keep)
            return {**state, "combine": cs}, mixed
        cs, first = self.combine.forecast(state["combine"], y_now, scored, seen, preds[0], keep)
        return {**state, "combine": cs}, [first]

    def _rollout(self, state, h, x, first=None):
        """Predictions of the next ``horizon`` values from hidden state h and input x (user
        units), with the weights as they are now; no learning. Each prediction is fed back as
        the next input. ``first``: h has already taken x and made this prediction.

        A prediction fed back is taken as if it had arrived: the signal transforms observe it
        (a normaliser's statistics move with each value), so the model sees each fed-back
        value encoded as a real one would be. Without that, a rollout of the default learner
        on Mackey-Glass was 20x worse at lead 2 than stepping it on its own prediction."""
        params, sig, T = self.from_block(state["params"]), self._signal(state), self.transform
        preds = [] if first is None else [first]
        every = jnp.ones(x.shape[:1], bool)
        while len(preds) < self.cfg.horizon:
            if preds:
                x = self._feed_back(x, preds[-1])
                sig = T.observe(sig, x, None, every) if sig else sig
            z = T.encode(sig, x)
            out, h = self._vplain(params, h, z)
            preds.append(T.decode(sig, x, self._head(state, out, z)[0]))
        return preds

    def _predict(self, state, x, active):
        ok = active & jnp.isfinite(_slot_sum(x))
        x = jnp.where(_lead(ok, x), x, 0)
        sig, T = self._signal(state), self.transform
        z = T.encode(sig, x)
        if self.learn_model:
            out, h, tr = self._vforward(self.from_block(state["params"]), state["hidden"], state["traces"], z, ok)
        else:
            out, h, tr = self._model(self.from_block(state["params"]), state, z, learn=False)
        out = T.decode(sig, x, self._head(state, out, z)[0])
        ok = ok & _carried_finite(h, tr)
        state = {**state, "hidden": _slot_where(ok, h, state["hidden"]), "traces": tr}
        nan = jnp.full(ok.shape, jnp.nan, jnp.float32)
        state = self._finish(state, active & ~ok, jnp.zeros_like(ok), nan)
        return state, out, nan, jnp.bool_(False)
