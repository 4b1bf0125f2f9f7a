"""A nested state as few arrays: every leaf (slots first) flattened into one (N, width) array per
dtype, and back.

Each array of the learner's state crosses the compiled step as a block of its packed buffers
(learner/packing.py), and on a small CPU each one costs about a microsecond a step whatever its
size; a combiner whose state is two dozen small arrays (the period detector's, the linear
expert's, its running statistics) keeps them as two here. ``flatten`` and ``unflatten`` are slicing, reshaping and
concatenation inside the compiled step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["flatten", "unflatten"]


def _key(dtype) -> str:
    return {"f": "float", "i": "int", "u": "int", "b": "bool"}.get(np.dtype(dtype).kind, np.dtype(dtype).str)


def flatten(tree) -> dict:
    """``{"float" | "int" | "bool": (N, width) array}`` of ``tree``'s leaves (each (N, ...)), in
    leaf order (one dtype of each kind: the float leaves share one dtype).

    Example::

        >>> import jax.numpy as jnp
        >>> flat = flatten({"a": jnp.zeros((2, 3)), "b": jnp.ones((2, 2, 2)), "k": jnp.zeros(2, jnp.int32)})
        >>> sorted((k, v.shape) for k, v in flat.items())
        [('float', (2, 7)), ('int', (2, 1))]
    """
    parts: dict = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        parts.setdefault(_key(leaf.dtype), []).append(leaf.reshape(leaf.shape[0], -1))
    return {k: v[0] if len(v) == 1 else _join(v) for k, v in parts.items()}


def _join(cols):
    """``jnp.concatenate(cols, axis=1)`` as selects of padded columns: elementwise, so XLA
    fuses the leaves' computations into the one kernel that writes the array."""
    width = sum(c.shape[1] for c in cols)
    at = np.cumsum([0] + [c.shape[1] for c in cols])
    col = jnp.arange(width)[None, :]
    out = jnp.pad(cols[-1], ((0, 0), (int(at[-2]), 0)))
    for i in range(len(cols) - 2, -1, -1):
        out = jnp.where(col < at[i + 1], jnp.pad(cols[i], ((0, 0), (int(at[i]), int(width - at[i + 1])))), out)
    return out


def unflatten(flat: dict, like):
    """The tree of ``flatten``: ``like`` gives the structure, trailing shapes and dtypes (a tree of
    arrays or ``jax.ShapeDtypeStruct``; its slot count is not used).

    Example::

        >>> import jax.numpy as jnp
        >>> tree = {"a": jnp.zeros((2, 3)), "k": jnp.arange(2, dtype=jnp.int32)}
        >>> back = unflatten(flatten(tree), tree)
        >>> back["a"].shape, [int(v) for v in back["k"]]
        ((2, 3), [0, 1])
    """
    leaves, treedef = jax.tree_util.tree_flatten(like)
    at: dict = {}
    out = []
    for leaf in leaves:
        key = _key(leaf.dtype)
        arr = flat[key]
        width = int(np.prod(leaf.shape[1:], dtype=np.int64))
        start = at.get(key, 0)
        at[key] = start + width
        out.append(arr[:, start:start + width].reshape((arr.shape[0],) + tuple(leaf.shape[1:])))
    return jax.tree_util.tree_unflatten(treedef, out)
