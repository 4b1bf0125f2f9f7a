"""Evaluate a jaxpr with hooks on marked ops and overrides of chosen variables.

This is how one traced step is re-run in the shapes the algorithms need: with marked-op
outputs cut or perturbed (for D and F), with op inputs captured (for x), or with the new
hidden values perturbed (for the learning signal dL/dh). It runs at trace time only.
"""
from __future__ import annotations

from typing import Callable

from jax.extend.core import Literal

from ..nn.ops import MARKED_OPS

__all__ = ["eval_jaxpr", "marked_kind", "CALL_PRIMITIVES"]

CALL_PRIMITIVES = ("jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
                   "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")


def marked_kind(eqn) -> str | None:
    """'matmul' / 'elementwise' for a marked weight op, else None."""
    if eqn.primitive.name in ("jit", "pjit"):
        entry = MARKED_OPS.get(eqn.params.get("name"))
        return entry[0] if entry else None
    return None


def eval_jaxpr(jaxpr, consts, args, *, op_hook: Callable | None = None,
               override: dict | None = None):
    """Evaluate ``jaxpr`` (an open Jaxpr) on ``args``; returns the list of outputs.

    op_hook(index, eqn, invals, bind) -> outval is called for each top-level marked op, in
    order, with ``bind()`` computing the op's normal value. ``override`` maps variables to
    functions applied to their value as soon as it is computed (every use, outputs included,
    sees the result).
    """
    env = {}
    override = override or {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    def write(v, val):
        if v in override:
            val = override[v](val)
        env[v] = val

    for v, val in zip(jaxpr.constvars, consts):
        write(v, val)
    for v, val in zip(jaxpr.invars, args):
        write(v, val)
    op_index = 0
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]

        def bind(eqn=eqn, invals=invals):
            params = eqn.primitive.get_bind_params(eqn.params)
            if isinstance(params, tuple):  # older jax: (subfuns, params)
                subfuns, params = params
                invals = [*subfuns, *invals]
            with eqn.ctx.manager:
                return eqn.primitive.bind(*invals, **params)

        if op_hook is not None and marked_kind(eqn) is not None:
            outs = [op_hook(op_index, eqn, invals, lambda: bind()[0])]
            op_index += 1
        else:
            outs = bind()
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, val in zip(eqn.outvars, outs):
            write(v, val)
    return [read(v) for v in jaxpr.outvars]
