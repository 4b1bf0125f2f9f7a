"""The product of a symmetric matrix with a vector, written the way each compiler runs it fastest.

For a symmetric P, (P r)_i = sum_j P_ij r_j = sum_j P_ji r_j: the sums over P's rows and over
its columns are the same numbers, added in another order. XLA (the jax learner) runs the row
form as a matrix-vector product. IREE (``streamtrace export``) runs the column form faster: each
step of the sum reads a whole contiguous row of P and adds it, scaled, to the result, a vector
operation along the row; its matrix-vector product instead gathers values across rows. Inside
``by_columns()``, which the export enters, ``sym_matvec`` is the column form.

The RLS readout's P is exactly symmetric, bit for bit: it starts at I / delta, and each update
subtracts an outer product whose (i, j) and (j, i) values are the same product rounded once
(rls.py).
"""
from __future__ import annotations

import jax.numpy as jnp

from .trace_mode import TraceMode

__all__ = ["sym_matvec", "by_columns"]

_COLUMNS = TraceMode()      # on inside by_columns()


def sym_matvec(P, r):
    """P r for symmetric matrices P (..., m, m) and vectors r (..., m) of the same leading axes
    (or r broadcast over them): a sum over P's rows, or inside ``by_columns`` over its columns.

    Parameters
    ----------
    P : array (..., m, m)
        Symmetric in its last two axes (for a P that is not, the column form gives P' r).
    r : array (..., m)
        Broadcast against P's leading axes.

    Returns
    -------
    array (..., m)
        P r.

    Example::

        >>> import jax.numpy as jnp
        >>> P = jnp.array([[2.0, 1.0], [1.0, 3.0]]); r = jnp.array([1.0, -1.0])
        >>> sym_matvec(P, r).tolist()
        [1.0, -2.0]
        >>> with by_columns():
        ...     sym_matvec(P, r).tolist()
        [1.0, -2.0]
    """
    if _COLUMNS.on:
        return jnp.sum(P * r[..., :, None], axis=-2)
    return jnp.einsum("...ij,...j->...i", P, r)


def by_columns():
    """A context manager: while it is open, ``sym_matvec`` traced on this thread is the sum over
    P's columns (``streamtrace export`` opens it around the programs IREE compiles). Blocks
    nest; jax's trace caches are cleared on entry and exit, so nothing traced one way is reused
    the other way (``TraceMode``).

    Example::

        >>> import jax, jax.numpy as jnp
        >>> with by_columns():
        ...     text = jax.jit(sym_matvec).lower(jnp.eye(3), jnp.ones(3)).as_text()
        >>> "dot_general" in text
        False
    """
    return _COLUMNS.enter()
