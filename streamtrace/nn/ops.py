"""Marked weight operations.

Each op computes exactly what the plain expression computes, but runs inside a nested
``jax.jit`` whose function name marks it. In a traced jaxpr it appears as one ``jit``
equation named ``streamtrace_<kind>``; the eligibility-trace compiler finds weights by
that name. Under an outer ``jax.jit`` XLA inlines it, so the marker costs nothing at run time.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["matmul", "elementwise", "MARKED_OPS", "MATMUL", "MATMUL_BIAS", "ELEMENTWISE"]

MATMUL = "streamtrace_matmul"
MATMUL_BIAS = "streamtrace_matmul_bias"
ELEMENTWISE = "streamtrace_elementwise"


def streamtrace_matmul(x, w):
    return jnp.matmul(x, w)


def streamtrace_matmul_bias(x, w, b):
    return jnp.matmul(x, w) + b


def streamtrace_elementwise(x, w):
    return x * w


# marker name -> (kind, the jitted op). The kind tells the compiler how x, W (and b) combine.
MARKED_OPS = {
    MATMUL: ("matmul", jax.jit(streamtrace_matmul)),
    MATMUL_BIAS: ("matmul", jax.jit(streamtrace_matmul_bias)),
    ELEMENTWISE: ("elementwise", jax.jit(streamtrace_elementwise)),
}


def matmul(x, w, b=None):
    """``y = x @ w (+ b)`` for ``x`` of shape (..., I), ``w`` (I, O), ``b`` (O,)."""
    if jnp.ndim(w) != 2:
        raise ValueError(f"matmul weight must be 2-D (in, out); got shape {jnp.shape(w)}")
    if jnp.shape(x)[-1:] != jnp.shape(w)[:1]:
        raise ValueError(f"matmul input of shape {jnp.shape(x)} does not match weight {jnp.shape(w)}")
    if b is None:
        return MARKED_OPS[MATMUL][1](x, w)
    if jnp.shape(b) != jnp.shape(w)[1:]:
        raise ValueError(f"matmul bias must have shape {jnp.shape(w)[1:]}; got {jnp.shape(b)}")
    return MARKED_OPS[MATMUL_BIAS][1](x, w, b)


def elementwise(x, w):
    """``y = x * w`` for ``x`` of shape (..., O) and a 1-D weight ``w`` of shape (O,)."""
    if jnp.ndim(w) != 1 or jnp.shape(x)[-1:] != jnp.shape(w):
        raise ValueError(f"elementwise weight must be 1-D matching x's last axis; got x {jnp.shape(x)}, w {jnp.shape(w)}")
    return MARKED_OPS[ELEMENTWISE][1](x, w)
