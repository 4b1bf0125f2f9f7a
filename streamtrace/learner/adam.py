"""Adam, with a learner step that guards each value without blocking in-place updates.

``adam(lr)`` is ``optax.adam(lr)``: the same ``init``, ``update`` and state, usable wherever an
optax transform is. The learner recognises it by ``guarded_step`` and applies it through that.

Why: the learner keeps a weight value and its moments whose update is not finite. Applied as
``optax.adam`` then a select per state leaf, the weight's new value is computed from the new
moments *before* their select, so XLA recomputes them from the old ones in the weight's pass;
with donated buffers it must then copy every old moment (both the moment pass and the weight
pass read it, and one of them writes it in place). ``guarded_step`` selects the moments first
and forms the weight's update from the moments it stores, so every pass reads what the one
before it wrote and all of them can run in place. Where a value's update is finite the result
is optax's up to rounding: the bias corrections and the learning rate are folded into two
scalars, so each value takes one division where optax takes two (the weight's pass is bound by
the divisions; GRU-256: ~8% of a step). tests/learner/test_adam.py holds it to ``optax.adam``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

__all__ = ["Adam", "ClippedAdam", "adam", "clipped"]


class Adam(optax.GradientTransformation):
    """``optax.adam``'s ``(init, update)`` and its hyperparameters (a constant learning rate)."""

    def guarded_step(self, grads, state, params, use):
        """(params, state) after one Adam step where ``use`` (a scalar) and, per value, the
        gradient and its square are finite; elsewhere weight and moments keep their values.
        (A moment that would overflow from a finite gradient keeps its value too.)"""
        lr, b1, b2, eps, eps_root = self.hyper
        old = state[0]
        if not isinstance(old, optax.ScaleByAdamState):
            raise TypeError(f"Adam.guarded_step needs optax.adam's state; got {type(old).__name__}")
        _, new = optax.scale_by_adam(b1, b2, eps, eps_root).update(grads, old)
        fine = jax.tree.map(lambda g: use & jnp.isfinite(g * g), grads)
        keep = lambda ok, n, o: jnp.where(ok & jnp.isfinite(n), n, o)  # noqa: E731
        mu = jax.tree.map(keep, fine, new.mu, old.mu)
        nu = jax.tree.map(keep, fine, new.nu, old.nu)
        count = jnp.where(use, new.count, old.count)
        # optax.scale_by_adam's update then optax.scale(-lr), formed from the stored moments,
        # with both bias corrections and the learning rate folded into two scalars: one
        # division per value instead of two (the weight's pass is bound by them, not by memory)
        scale = -lr / (1 - b1 ** new.count)
        inv_c2 = 1 / (1 - b2 ** new.count)
        update = lambda m, v: (scale.astype(m.dtype) * m) / (  # noqa: E731
            jnp.sqrt(v * inv_c2.astype(v.dtype) + eps_root) + eps)
        updates = jax.tree.map(update, mu, nu)
        params = jax.tree.map(keep, fine, optax.apply_updates(params, updates), params)
        return params, (optax.ScaleByAdamState(count=count, mu=mu, nu=nu), *state[1:])


def adam(learning_rate: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         eps_root: float = 0.0):
    """Adam, as ``optax.adam``, which the learner applies in place (the default optimizer).

    The same ``init``, ``update`` and state as ``optax.adam(learning_rate, b1, b2, eps,
    eps_root)``, usable wherever an optax transform is; the learner steps it so that a value
    whose update is not finite keeps its old value without extra copies (see the module). A
    learning-rate schedule gives plain ``optax.adam``.

    Parameters
    ----------
    learning_rate : float or optax schedule, default 1e-3
        The step size.
    b1, b2 : float, default 0.9, 0.999
        The decay rates of the first and second moment estimates.
    eps, eps_root : float, default 1e-8, 0.0
        Added to the denominator outside and inside the square root.

    Returns
    -------
    optax.GradientTransformation

    Examples
    --------
    >>> import jax.numpy as jnp, streamtrace as st
    >>> opt = st.adam(0.1)
    >>> params = {"w": jnp.ones(2)}
    >>> updates, state = opt.update({"w": jnp.ones(2)}, opt.init(params), params)
    >>> [round(float(u), 3) for u in updates["w"]]      # Adam's first step: -lr * sign(grad)
    [-0.1, -0.1]
    """
    inner = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root)
    if callable(learning_rate):
        return inner
    out = Adam(inner.init, inner.update)
    out.hyper = (float(learning_rate), b1, b2, eps, eps_root)
    return out


class ClippedAdam(optax.GradientTransformation):
    """``optax.chain(optax.clip_by_global_norm(max_norm), adam)``'s ``(init, update)`` and
    state, stepped in place like ``Adam``: the gradients scaled to a global norm of at most
    ``max_norm`` (optax's own clip), then ``Adam.guarded_step``. A non-finite gradient makes
    the norm non-finite, so the guard keeps every value it reaches, as optax's chain then a
    per-value guard does."""

    def guarded_step(self, grads, state, params, use):
        grads, _ = optax.clip_by_global_norm(self.max_norm).update(grads, state[0])
        params, inner = self.adam.guarded_step(grads, state[1], params, use)
        return params, (state[0], inner)


def clipped(max_norm: float, opt: optax.GradientTransformation) -> optax.GradientTransformation:
    """``optax.chain(optax.clip_by_global_norm(max_norm), opt)``; in place when opt is ``adam``."""
    chain = optax.chain(optax.clip_by_global_norm(max_norm), opt)
    if not isinstance(opt, Adam):
        return chain
    out = ClippedAdam(chain.init, chain.update)
    out.adam, out.max_norm = opt, max_norm
    return out
