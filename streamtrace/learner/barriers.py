"""Values computed once and kept, in the programs XLA compiles and in those IREE compiles.

Compilers fuse freely and may compute a cheap value again inside every consumer (a factor
inside every element of a matrix update, a gradient expression inside both the finiteness
check and the optimizer). ``hold`` keeps such a value apart. For XLA (the jax learner) that is
an optimisation barrier (``jax.lax.optimization_barrier``). IREE (``streamtrace export``)
lowers a barrier to a point where the host waits for the device, and the step then runs as
several command buffers one after the other; inside ``without_barriers()`` ``hold`` is a sum
with zero instead, a reduction, which IREE computes in a dispatch of its own and does not fuse
into the elementwise work that reads it. The values are the same either way (a sum with zero
turns a negative zero into a positive one, nothing else).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from .trace_mode import TraceMode

__all__ = ["hold", "without_barriers"]

_SUMMED = TraceMode()       # on inside without_barriers()


def _apart(v):
    return jnp.sum(jnp.stack([v, jnp.zeros_like(v)]), axis=0)


def hold(x):
    """``x`` (a pytree of arrays) kept apart from its consumers: behind an optimisation
    barrier, or inside ``without_barriers`` as a sum with zero.

    Parameters
    ----------
    x : pytree of arrays
        The values to compute once and keep.

    Returns
    -------
    The same pytree, the same values.

    Example::

        >>> import jax, jax.numpy as jnp
        >>> "optimization_barrier" in jax.jit(lambda a: hold(a) + 1).lower(jnp.ones(2)).as_text()
        True
        >>> with without_barriers():
        ...     text = jax.jit(lambda a: hold(a) + 2).lower(jnp.ones(2)).as_text()
        >>> "optimization_barrier" in text, "reduce" in text
        (False, True)
    """
    if _SUMMED.on:
        return jax.tree_util.tree_map(_apart, x)
    return jax.lax.optimization_barrier(x)


@contextlib.contextmanager
def without_barriers():
    """Trace ``hold`` as a sum with zero, not a barrier, on this thread (nested calls allowed):
    for a program IREE compiles. jax's trace caches are cleared on the way in and out
    (``TraceMode``).

    Example::

        >>> with without_barriers():
        ...     pass
    """
    with _SUMMED.enter():
        yield
