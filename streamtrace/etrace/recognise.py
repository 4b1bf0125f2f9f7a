"""Find weight ops written without streamtrace.nn.ops: plain ``x @ W (+ b)`` and ``x * w``
on a parameter, as brainstate's own layers and plain jax models write them.

The compiler finds weights by their marked ops. A plain ``dot_general`` on a ParamState is
invisible to it: the weight would learn as an instant parameter with the one-step gradient
only (wrong whenever its output drives a hidden state). This pass rewrites the plain forms
into the equivalent marked ops before the analysis, so they get eligibility traces like ours.
It rewrites only unambiguous patterns: a parameter used once, in the standard layout.
"""
from __future__ import annotations

from collections import Counter

import jax
from jax.extend.core import Literal

from ..nn.ops import ELEMENTWISE, MARKED_OPS, MATMUL, MATMUL_BIAS

__all__ = ["mark_plain_weights"]


def _marked_eqn(marker, invars, outvar):
    """A marked-op equation like the one ``streamtrace.nn.ops`` would have produced."""
    structs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in invars]
    eqn = jax.make_jaxpr(MARKED_OPS[marker][1])(*structs).jaxpr.eqns[0]
    assert eqn.outvars[0].aval.shape == outvar.aval.shape
    return eqn.replace(invars=list(invars), outvars=[outvar])


def _is_var(v):
    return not isinstance(v, Literal)


def mark_plain_weights(jaxpr, param_vars: set):
    """Return (jaxpr with plain weight ops marked, {param var: what was recognised})."""
    uses = Counter(v for e in jaxpr.eqns for v in e.invars if _is_var(v))
    uses.update(v for v in jaxpr.outvars if _is_var(v))
    producer = {v: e for e in jaxpr.eqns for v in e.outvars}
    consumers = {}
    for e in jaxpr.eqns:
        for v in e.invars:
            if _is_var(v):
                consumers.setdefault(v, []).append(e)

    def sole_param(v):
        return _is_var(v) and v in param_vars and uses[v] == 1

    def only_consumer(v):
        c = consumers.get(v, [])
        return c[0] if len(c) == 1 and uses[v] == 1 else None

    replace, drop, found = {}, set(), {}
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general" and len(eqn.invars) == 2:
            x, w = eqn.invars
            y = eqn.outvars[0]
            if not (_is_var(x) and x not in param_vars and sole_param(w) and w.aval.ndim == 2
                    and x.aval.ndim >= 1 and x.aval.dtype == w.aval.dtype == y.aval.dtype):
                continue
            if eqn.params["dimension_numbers"] != (((x.aval.ndim - 1,), (0,)), ((), ())):
                continue
            # a bias added right after: y + broadcast(b), b a parameter of shape (O,)
            add = only_consumer(y)
            bias = None
            if add is not None and add.primitive.name == "add":
                other = add.invars[1] if add.invars[0] is y else add.invars[0]
                bc = producer.get(other) if _is_var(other) else None
                if (bc is not None and bc.primitive.name == "broadcast_in_dim" and sole_param(bc.invars[0])
                        and only_consumer(other) is add and bc.invars[0].aval.shape == w.aval.shape[1:]
                        and tuple(bc.params["broadcast_dimensions"]) == (other.aval.ndim - 1,)
                        and add.outvars[0].aval.shape == y.aval.shape
                        and bc.invars[0].aval.dtype == y.aval.dtype):
                    bias = bc.invars[0]
                elif (_is_var(other) and sole_param(other) and other.aval.shape == y.aval.shape == w.aval.shape[1:]
                      and other.aval.dtype == y.aval.dtype):
                    bias = other
            if bias is not None:
                drop.add(id(eqn))
                if bias is not other:
                    drop.add(id(producer[other]))
                replace[id(add)] = _marked_eqn(MATMUL_BIAS, [x, w, bias], add.outvars[0])
                found[w] = found[bias] = "matmul"
            else:
                replace[id(eqn)] = _marked_eqn(MATMUL, [x, w], y)
                found[w] = "matmul"
        elif name == "mul" and len(eqn.invars) == 2:
            y = eqn.outvars[0]
            for a, b in (eqn.invars, eqn.invars[::-1]):
                w = b
                bc = producer.get(b) if _is_var(b) else None
                if bc is not None and bc.primitive.name == "broadcast_in_dim" and only_consumer(b) is eqn \
                        and tuple(bc.params["broadcast_dimensions"]) == (b.aval.ndim - 1,):
                    w = bc.invars[0]
                if not (sole_param(w) and _is_var(a) and a not in param_vars and w.aval.ndim == 1
                        and a.aval.shape == y.aval.shape and a.aval.shape[-1:] == w.aval.shape
                        and a.aval.dtype == w.aval.dtype == y.aval.dtype):
                    continue
                if w is not b:
                    drop.add(id(bc))
                replace[id(eqn)] = _marked_eqn(ELEMENTWISE, [a, w], y)
                found[w] = "elementwise"
                break
    if not replace:
        return jaxpr, found
    eqns = [replace.get(id(e), e) for e in jaxpr.eqns if id(e) not in drop]
    return jaxpr.replace(eqns=eqns), found
