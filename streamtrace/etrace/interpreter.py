"""Evaluate a jaxpr with hooks on marked ops and overrides of chosen variables.

This is how one traced step is re-run in the shapes the algorithms need: with marked-op
outputs cut or perturbed (for D and F), with op inputs captured (for x), or with the new
hidden values perturbed (for the learning signal dL/dh). It runs at trace time only.
"""
from __future__ import annotations

from typing import Callable

from jax.extend.core import Literal

from ..nn.ops import MARKED_OPS
from .custom_rules import bind_eqn, forward_differentiable, is_custom

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
        bind = lambda eqn=eqn, invals=invals: bind_eqn(eqn, invals)

        if op_hook is not None and marked_kind(eqn) is not None:
            outs = [op_hook(op_index, eqn, invals, lambda: bind()[0])]
            op_index += 1
        elif is_custom(eqn) == "vjp":
            # forward-mode derivatives of the step (D, F, RTRL's Jacobians) need this
            outs = forward_differentiable(eqn)(*invals)
        elif _holds_custom_vjp(eqn):
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            outs = eval_jaxpr(sub.jaxpr, sub.consts, invals)
        else:
            outs = bind()
        for v, val in zip(eqn.outvars, outs):
            write(v, val)
    return [read(v) for v in jaxpr.outvars]


def _holds_custom_vjp(eqn) -> bool:
    """A call (nested jit) with a custom_vjp function somewhere inside."""
    if eqn.primitive.name not in CALL_PRIMITIVES or is_custom(eqn):
        return False
    sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    if not hasattr(sub, "consts"):
        return False
    from jax.extend.core import jaxprs_in_params

    def walk(j):
        return any(is_custom(e) == "vjp" or any(walk(getattr(s, "jaxpr", s)) for s in jaxprs_in_params(e.params))
                   for e in j.eqns)
    return walk(sub.jaxpr)
