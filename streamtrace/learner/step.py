"""The learner's pure step functions over a named state tree.

State layout (a dict; every leaf has a stable name once flattened, e.g. ``hidden.cell.h``):

    params, opt, acc   the weights as one packed (rows, width) block, the optimizer state
                       over that block, summed gradients (learn-every-k); ``ParamBlock``
                       names every row range, so checkpoints and ``state_dict`` stay readable
    hidden, traces     per slot (leading axis N)
    pending            forecast mode: the last input x_{t-1} and whether it is valid
    stats              counters [step, updates, skipped, rejected, since_update] and the
                       per-slot prequential loss sum and count

One block instead of one array per weight: the optimizer then runs as a couple of fused
kernels rather than a few per weight, and each kernel costs ~0.5-1 us on a small CPU.
Shared weights: one ``params`` for all N slots; per-slot weights: every leaf gets a leading
slot axis and the shared step runs under ``vmap`` with one slot each.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

from .packing import Layout

__all__ = ["StepConfig", "StepFunctions", "MODES", "COUNTERS"]

MODES = ("supervised", "forecast", "predict")
COUNTERS = ("step", "updates", "skipped", "rejected", "since_update")
_C = {n: i for i, n in enumerate(COUNTERS)}


@dataclass(frozen=True)
class StepConfig:
    mode: str = "supervised"
    learn_every: int = 1
    reduce: str = "mean"       # how slot losses combine with shared weights


def _lead(ok, a):
    return ok.reshape(ok.shape + (1,) * (a.ndim - ok.ndim))


def _slot_where(ok, new, old):
    """Per-slot select: ok (N,) against leaves with a leading slot axis."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(_lead(ok, a), a, b), new, old)


def _slot_sum(tree):
    """(N,) sum of every value of each slot: finite iff all of them are (or it overflowed,
    which we also refuse)."""
    return sum(jnp.sum(x.reshape(x.shape[0], -1), axis=1) for x in jax.tree_util.tree_leaves(tree))


class StepFunctions:
    """Builds ``step(state, x, target, active, learn) -> (state, prediction, loss, applied)``
    for N slots sharing one set of weights; x/target carry the slot axis. ``active`` (N,):
    the slot advances this step; ``learn`` (N,): it also contributes to the weight update."""

    def __init__(self, algo, loss_fn, optimizer: optax.GradientTransformation, cfg: StepConfig):
        if cfg.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {cfg.mode!r}")
        if cfg.learn_every < 1:
            raise ValueError(f"learn_every must be >= 1; got {cfg.learn_every}")
        if cfg.reduce not in ("mean", "sum"):
            raise ValueError(f"reduce must be 'mean' or 'sum'; got {cfg.reduce!r}")
        self.algo, self.loss_fn, self.opt, self.cfg = algo, loss_fn, optimizer, cfg
        self.param_layout = Layout(algo.graph.init_params())
        self._vstep = jax.vmap(lambda p, h, tr, x: algo(p, h, tr, x), in_axes=(None, 0, 0, 0))
        self._vforward = jax.vmap(lambda p, h, tr, x: algo.forward(p, h, tr, (x,)), in_axes=(None, 0, 0, 0))
        self._vplain = jax.vmap(lambda p, h, x: algo.graph.run(p, h, (x,)), in_axes=(None, 0, 0))

    # ---- params as one block ------------------------------------------------------------
    def to_block(self, params: dict):
        return self.param_layout.pack(params)[0]

    def from_block(self, block) -> dict:
        return self.param_layout.unpack((block,))

    # ---- state ------------------------------------------------------------------------
    def init(self, n_slots: int, x_shape, x_dtype, params=None) -> dict:
        p0, h0, tr0 = self.algo.init_state()
        block = self.to_block(p0 if params is None else params)
        tile = lambda t: jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (n_slots,) + v.shape), t)
        state = {"params": block, "opt": self.opt.init(block), "hidden": tile(h0), "traces": tile(tr0),
                 "stats": {"counters": jnp.zeros(len(COUNTERS), jnp.int32),
                           "preq_sum": jnp.zeros(n_slots, jnp.float32),
                           "preq_n": jnp.zeros(n_slots, jnp.int32)}}
        if self.cfg.learn_every > 1:
            state["acc"] = jnp.zeros_like(block)
        if self.cfg.mode == "forecast":
            state["pending"] = {"x": jnp.zeros((n_slots,) + tuple(x_shape), x_dtype),
                                "valid": jnp.zeros(n_slots, jnp.int32)}
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

    def _grad(self, total, state):
        """Gradient of total(params dict) w.r.t. the weights, as a block."""
        (_, aux), g = jax.value_and_grad(lambda blk: total(self.from_block(blk)), has_aux=True)(state["params"])
        return aux, g

    def _count(self, counters, **inc):
        for name, v in inc.items():
            counters = counters.at[_C[name]].add(jnp.asarray(v, jnp.int32))
        return counters

    def _apply(self, state, grads, any_ok):
        """Optimizer step (or accumulation), refused when the gradient is not finite."""
        counters = state["stats"]["counters"]
        finite = jnp.isfinite(jnp.sum(grads))
        use = any_ok & finite
        counters = self._count(counters, rejected=any_ok & ~finite)
        params, opt = state["params"], state["opt"]
        k = self.cfg.learn_every
        new = dict(state)
        if k == 1:
            updates, opt2 = self.opt.update(grads, opt, params)
            new["params"] = jnp.where(use, optax.apply_updates(params, updates), params)
            new["opt"] = jax.tree_util.tree_map(lambda a, b: jnp.where(use, a, b), opt2, opt)
            applied = use
        else:
            acc = jnp.where(use, state["acc"] + grads, state["acc"])
            since = counters[_C["since_update"]] + use.astype(jnp.int32)
            applied = since >= k

            def do(args):
                params, opt, acc = args
                updates, opt = self.opt.update(acc, opt, params)
                return optax.apply_updates(params, updates), opt, jnp.zeros_like(acc)
            new["params"], new["opt"], new["acc"] = jax.lax.cond(applied, do, lambda a: a, (params, opt, acc))
            counters = counters.at[_C["since_update"]].set(jnp.where(applied, 0, since))
        counters = self._count(counters, updates=applied)
        new["stats"] = {**state["stats"], "counters": counters}
        return new, applied

    def _finish(self, state, skipped, scored, losses):
        """Count the step, the skipped slots, and the prequential loss of the scored ones."""
        stats = dict(state["stats"])
        stats["counters"] = self._count(stats["counters"], step=1, skipped=jnp.sum(skipped))
        stats["preq_sum"] = stats["preq_sum"] + jnp.where(scored, losses, 0.0).astype(jnp.float32)
        stats["preq_n"] = stats["preq_n"] + scored.astype(jnp.int32)
        return {**state, "stats": stats}

    def _supervised(self, state, x, target, active, learn):
        x_ok = active & jnp.isfinite(_slot_sum(x))
        ok = x_ok & (jnp.isfinite(_slot_sum(target)) | ~learn)
        learning = ok & learn
        # a bad slot's numbers must not reach the summed gradient, not even as 0 * NaN
        x, target = jnp.where(_lead(ok, x), x, 0), jnp.where(_lead(learning, target), target, 0)

        def total(p):
            out, h, tr = self._vstep(p, state["hidden"], state["traces"], x)
            losses = jax.vmap(self.loss_fn)(out, target)
            return self._weighted(losses, learning), (out, h, tr, losses)
        (out, h, tr, losses), grads = self._grad(total, state)
        ok = ok & jnp.isfinite(_slot_sum(h) + _slot_sum(tr)) & (jnp.isfinite(losses) | ~learning)
        learning = learning & ok
        state = {**state, "hidden": _slot_where(ok, h, state["hidden"]),
                 "traces": _slot_where(ok, tr, state["traces"])}
        state, applied = self._apply(state, grads, jnp.any(learning))
        state = self._finish(state, active & ~ok, learning, losses)
        return state, out, jnp.where(learning, losses, jnp.nan), applied

    def _forecast(self, state, x, active, learn):
        """Learn from the prediction made at t-1 (its target is x_t), then predict x_{t+1}.

        The state holds where step t-1 began (hidden, traces, x_{t-1}); replaying that step
        under the custom VJP gives the online gradient of the t-1 prediction and the state
        at t-1, from which the next prediction is made with the updated weights.
        """
        pend = state["pending"]
        x_ok = active & jnp.isfinite(_slot_sum(x))
        has_prev = x_ok & (pend["valid"] > 0)
        learning = has_prev & learn
        x = jnp.where(_lead(x_ok, x), x, 0)

        def total(p):
            out, h, tr = self._vstep(p, state["hidden"], state["traces"], pend["x"])
            losses = jax.vmap(self.loss_fn)(out, x)
            return self._weighted(losses, learning), (h, tr, losses)
        (h1, tr1, losses), grads = self._grad(total, state)
        advance = has_prev & jnp.isfinite(_slot_sum(h1) + _slot_sum(tr1))
        learning = learning & advance & jnp.isfinite(losses)
        state, applied = self._apply(state, grads, jnp.any(learning))
        # the state at t-1 (replayed), or the held one where there was nothing to replay
        h_cur = _slot_where(advance, h1, state["hidden"])
        tr_cur = _slot_where(advance, tr1, state["traces"])
        pred, _ = self._vplain(self.from_block(state["params"]), h_cur, x)
        keep = x_ok & (advance | ~has_prev)
        state = {**state, "hidden": _slot_where(keep, h_cur, state["hidden"]),
                 "traces": _slot_where(keep, tr_cur, state["traces"]),
                 "pending": {"x": jnp.where(_lead(keep, x), x, pend["x"]),
                             "valid": jnp.where(keep, 1, pend["valid"]).astype(jnp.int32)}}
        state = self._finish(state, active & ~keep, learning, losses)
        return state, pred, jnp.where(learning, losses, jnp.nan), applied

    def _predict(self, state, x, active):
        ok = active & jnp.isfinite(_slot_sum(x))
        x = jnp.where(_lead(ok, x), x, 0)
        out, h, tr = self._vforward(self.from_block(state["params"]), state["hidden"], state["traces"], x)
        ok = ok & jnp.isfinite(_slot_sum(h) + _slot_sum(tr))
        state = {**state, "hidden": _slot_where(ok, h, state["hidden"]),
                 "traces": _slot_where(ok, tr, state["traces"])}
        nan = jnp.full(ok.shape, jnp.nan, jnp.float32)
        state = self._finish(state, active & ~ok, jnp.zeros_like(ok), nan)
        return state, out, nan, jnp.bool_(False)
