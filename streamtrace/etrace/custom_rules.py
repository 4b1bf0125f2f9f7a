"""User-defined derivative rules (``jax.custom_jvp`` / ``jax.custom_vjp``) inside a step.

Two needs. The compiler must know the Jacobian structure of such a function (which inputs
an output depends on, element-wise or mixing neurons); equal shapes prove nothing, so we
trace the derivative the rule actually defines and analyse that jaxpr. And the algorithms
take forward-mode derivatives of the step (linearize for D and F, jacfwd for RTRL), which
jax cannot do through a custom_vjp; ``forward_differentiable`` re-expresses a custom_vjp call
as a custom_jvp whose tangent map is the transpose of the user's backward rule: the same
linear map, so forward- and reverse-mode derivatives both follow the user's rule exactly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["bind_eqn", "is_custom", "forward_differentiable", "tangent_jaxpr", "function_name"]


def bind_eqn(eqn, invals):
    """Apply ``eqn``'s primitive to ``invals``; always returns a list of outputs."""
    params = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(params, tuple):  # older jax: (subfuns, params)
        subfuns, params = params
        invals = [*subfuns, *invals]
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def is_custom(eqn) -> str | None:
    """'jvp' / 'vjp' for a custom-rule call, else None."""
    name = eqn.primitive.name
    if name.startswith("custom_jvp_call"):
        return "jvp"
    if name.startswith("custom_vjp_call"):
        return "vjp"
    return None


def function_name(eqn) -> str:
    name = eqn.params.get("name")
    if name:
        return str(name)
    sub = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
    info = getattr(getattr(sub, "jaxpr", sub), "debug_info", None)
    return getattr(info, "func_name", None) or "<anonymous>"


def _inexact(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def forward_differentiable(eqn):
    """A function of ``eqn``'s inputs, equal to it, that jax can also differentiate in forward
    mode. custom_jvp calls are returned as they are."""
    if is_custom(eqn) != "vjp":
        return lambda *args: bind_eqn(eqn, args)

    @jax.custom_jvp
    def f(*args):
        return tuple(bind_eqn(eqn, args))

    @f.defjvp
    def f_jvp(primals, tangents):
        diff = [i for i, p in enumerate(primals) if _inexact(p)]

        def g(*d):
            full = list(primals)
            for i, v in zip(diff, d):
                full[i] = v
            return tuple(bind_eqn(eqn, full))

        outs, vjp_fn = jax.vjp(g, *[primals[i] for i in diff])
        # the user's bwd is the linear map ct -> J^T ct; its transpose is t -> J t
        (t_out,) = jax.linear_transpose(vjp_fn, outs)(tuple(tangents[i] for i in diff))
        return outs, t_out

    return lambda *args: list(f(*args))


def tangent_jaxpr(eqn):
    """The jaxpr of ``eqn``'s derivative rule as a tangent map: (jaxpr, tangent invar per
    input (None for non-float inputs), tangent outvar per output). Its primal inputs are
    invars too; only the tangent invars carry the dependence the caller is asking about."""
    fn = forward_differentiable(eqn)
    avals = [v.aval for v in eqn.invars]
    diff = [jnp.issubdtype(a.dtype, jnp.inexact) for a in avals]

    def jvp(primals, tangents):
        it = iter(tangents)
        tans = [next(it) if d else np.zeros(p.shape, jax.dtypes.float0) for p, d in zip(primals, diff)]
        return jax.jvp(lambda *a: tuple(fn(*a)), tuple(primals), tuple(tans))[1]

    prim = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    tans = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a, d in zip(avals, diff) if d]
    closed = jax.make_jaxpr(jvp)(prim, tans)
    jaxpr = closed.jaxpr
    n = len(avals)
    t_vars = iter(jaxpr.invars[n:])
    tangent_in = [next(t_vars) if d else None for d in diff]
    return closed, tangent_in, list(jaxpr.outvars)
