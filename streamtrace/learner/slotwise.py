"""Slot-wise computations that ``vmap`` leaves as they are: the mapped axis folded into the slot axis.

The engine's per-stream learner vmaps its step over the slots (a model each,
learner/programs.py). A computation that already works slot by slot on arrays with the slot
axis first (the experts combiner, the period detector) gains nothing from it and loses two
ways: ``jax.lax.cond`` whose predicate varies along the mapped axis becomes a select (both
branches run on every call: the detector's search, due every few targets, would run on
every step), and the batched program XLA compiles differs from the learner's (other fusions,
other kernels). ``slotwise(fn)`` under ``vmap`` reshapes every argument from (B, N, ...) to
(B N, ...), calls ``fn`` unmapped and reshapes its results back (a
``jax.custom_batching.custom_vmap`` rule): the same computation as a learner of B N slots.
``when_due`` is a branch taken when any slot is due, built on it.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax import custom_batching

from .trace_mode import TraceMode

_BRANCHLESS = TraceMode()       # on inside without_branches()

__all__ = ["slotwise", "when_due", "apart", "without_branches"]


def slotwise(fn):
    """``fn`` (arrays with the slot axis first in, the same out), folded under ``vmap``.

    Parameters
    ----------
    fn : callable
        Of pytrees of arrays, every leaf (N, ...), returning a pytree of (N, ...) arrays;
        slot by slot: slot i of a result depends on slot i of the arguments alone.

    Returns
    -------
    callable
        ``fn`` itself outside ``vmap``; under ``vmap`` (any depth) ``fn`` once on the
        mapped copies' slots side by side.

    Example::

        >>> import jax, jax.numpy as jnp
        >>> double = slotwise(lambda s: {"x": 2 * s["x"]})
        >>> jax.vmap(double)({"x": jnp.ones((3, 1))})["x"].shape
        (3, 1)
    """
    def call(*args):
        if not _mapped(args):       # traced as it is: a custom_vmap around a branch of the period
            return fn(*args)        # search made IREE's compiler crash (the exported step)

        @custom_batching.custom_vmap
        def run(*args):
            return fn(*args)

        @run.def_vmap
        def rule(size, batched, *args):
            lift = lambda v, b: v if b else jnp.broadcast_to(v, (size,) + v.shape)
            fold = lambda v: v.reshape((-1,) + v.shape[2:])
            out = call(*jax.tree_util.tree_map(lambda v, b: fold(lift(v, b)), args, tuple(batched)))
            return (jax.tree_util.tree_map(lambda v: v.reshape((size, -1) + v.shape[1:]), out),
                    jax.tree_util.tree_map(lambda _: True, out))
        return run(*args)
    return call


def _mapped(args) -> bool:
    """Whether ``args`` are traced by ``vmap`` (a leaf is a batching tracer; jax names the
    class so in every version we support, and were it renamed, ``fn`` runs mapped as before)."""
    return any(type(v).__name__ == "BatchTracer" for v in jax.tree_util.tree_leaves(args))


def when_due(fn, due, s):
    """``fn(due, s)`` where any of ``due`` (N,) is true, else ``s`` unchanged: a branch
    (``lax.cond``), skipped on a step where no slot is due (inside ``without_branches``:
    ``fn`` on every step, as a ``vmap``'d branch runs).

    Parameters
    ----------
    fn : callable
        ``fn(due, s) -> s``, slot by slot; a slot not due must come back as it was.
    due : array of bool, shape (N,)
        Which slots are due.
    s : pytree of arrays
        The state, every leaf with the slot axis first (N, ...).

    Returns
    -------
    The new state, of ``s``'s structure.

    Example::

        >>> import jax.numpy as jnp
        >>> bump = lambda due, s: {"x": jnp.where(due, s["x"] + 1, s["x"])}
        >>> when_due(bump, jnp.array([True, False]), {"x": jnp.zeros(2)})["x"].tolist()
        [1.0, 0.0]
        >>> with without_branches():
        ...     when_due(bump, jnp.array([False, True]), {"x": jnp.zeros(2)})["x"].tolist()
        [0.0, 1.0]
    """
    if _BRANCHLESS.on:
        return fn(due, s)
    return jax.lax.cond(jnp.any(due), fn, lambda due, s: s, due, s)


def apart(fn, *args):
    """``fn(*args)`` as a computation of its own: a branch (``lax.cond``, both ways ``fn``)
    that XLA compiles apart from the program around it. A value computed there is the same
    bits in every program that calls it on the same arguments: outside, XLA fuses each
    operation with its neighbours, so a product and the sum it feeds may become one fused
    multiply-add in one program and two roundings in another, or a cheap result may be
    recomputed inside each consumer. (The reply-first prediction program, which keeps only
    what the prediction needs, must answer the step's bits: tests/engine/test_reply_first.py.)
    Inside ``without_branches``: ``fn(*args)`` as it is.

    Parameters
    ----------
    fn : callable
        Of ``args``, returning a pytree of arrays.
    *args : pytrees of arrays
        The operands; every leaf becomes an operand of the branch.

    Returns
    -------
    ``fn(*args)``.

    Example::

        >>> import jax.numpy as jnp
        >>> apart(lambda a, b: a * b + 1, jnp.float32(2), jnp.float32(3)).item()
        7.0
    """
    if _BRANCHLESS.on:
        return fn(*args)
    # a predicate XLA cannot fold (a constant one would inline the branch); either way: fn
    leaves = jax.tree_util.tree_leaves(args)
    taken = jnp.isnan(jnp.ravel(leaves[0])[0]) if leaves else jnp.bool_(True)
    return jax.lax.cond(taken, fn, fn, *args)


@contextlib.contextmanager
def without_branches():
    """Trace ``when_due`` without a branch: for a program IREE compiles (``streamtrace
    export``), whose compiler (3.13) crashes on the period detector's search inside a branch.
    The values are the same; the search runs on every step. jax's trace caches are cleared
    on the way in and out (a jitted function traced with branches is not reused without them,
    nor the other way round).

    Example::

        >>> with without_branches():
        ...     pass
    """
    with _BRANCHLESS.enter():
        yield
