"""Dependency analysis of one traced step.

For every jaxpr variable we track which *sources* it depends on differentiably, and how:
``DIAG`` when the Jacobian w.r.t. that source is diagonal (element-wise, same shape), ``DENSE``
otherwise, together with the primitive that first made it dense (for error messages).
Sources are previous hidden values ``("h", i)``, marked-op outputs ``("y", k)`` and, for the
output check, cut new hidden values ``("hn", i)``. Marked matmuls cut the dependence on their
input: that cut is the diagonal approximation. Marked element-wise ops keep it (a diagonal
path), so diagonal recurrences stay exact.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from jax.extend.core import Literal

from .errors import CompileError
from .custom_rules import function_name, is_custom, tangent_jaxpr
from .interpreter import CALL_PRIMITIVES, marked_kind

__all__ = ["DIAG", "DENSE", "StepAnalysis", "analyze"]

DIAG, DENSE = "diag", "dense"

ELEMENTWISE = frozenset("""
add sub mul div neg max min exp exp2 log log1p expm1 tanh logistic sin cos tan asin acos atan
sinh cosh asinh acosh atanh sqrt rsqrt cbrt pow integer_pow square abs erf erfc erf_inv lgamma
digamma atan2 rem clamp select_n convert_element_type copy copy_p reduce_precision nextafter
add_any real imag conj
""".split())
# Primitives with zero derivative: the value may depend on a source, the gradient does not.
ZERO_DERIVATIVE = frozenset("""
stop_gradient gt ge lt le eq ne and or not xor sign floor ceil round is_finite iota
random_bits random_seed random_wrap random_unwrap shift_left shift_right_logical
shift_right_arithmetic population_count argmax argmin
""".split())
SHAPE_ONLY = frozenset("reshape squeeze expand_dims broadcast_in_dim".split())
LOOPS = frozenset("while scan cond fori_loop".split())


def _merge(into: dict, deps: dict, force_dense_why: str | None = None):
    for src, (kind, why) in deps.items():
        if force_dense_why is not None and kind == DIAG:
            kind, why = DENSE, force_dense_why
        old = into.get(src)
        if old is None or (old[0] == DIAG and kind == DENSE):
            into[src] = (kind, why)


def _shape(v):
    return tuple(v.aval.shape) if hasattr(v.aval, "shape") else ()


def _size(v):
    return int(np.prod(_shape(v), dtype=np.int64))


@dataclass
class MarkedOp:
    index: int
    kind: str
    eqn: object

    @property
    def x(self):
        return self.eqn.invars[0]

    @property
    def w(self):
        return self.eqn.invars[1]

    @property
    def b(self):
        return self.eqn.invars[2] if len(self.eqn.invars) > 2 else None

    @property
    def y(self):
        return self.eqn.outvars[0]


@dataclass
class StepAnalysis:
    deps: dict                      # var -> {source: (kind, why)}
    ops: list = field(default_factory=list)  # MarkedOp, in program order


def _contains_marked(jaxpr) -> str | None:
    from jax.extend.core import jaxprs_in_params
    for eqn in jaxpr.eqns:
        if marked_kind(eqn) is not None:
            return eqn.params["name"]
        for sub in jaxprs_in_params(eqn.params):
            found = _contains_marked(getattr(sub, "jaxpr", sub))
            if found:
                return found
    return None


@dataclass
class _Walk:
    """One pass of :func:`analyze` over a jaxpr: the deps found so far and the settings."""
    deps: dict
    result: StepAnalysis
    cut: dict
    param_names: dict
    top_level: bool
    through_ops: bool

    def get(self, v):
        return {} if isinstance(v, Literal) else self.deps.get(v, {})

    def put(self, v, d):
        self.deps[v] = {self.cut[v]: (DIAG, None)} if v in self.cut else d

    def weight_name(self, w):
        return None if isinstance(w, Literal) else self.param_names.get(w)


# ---- one rule per kind of primitive: (applies to the equation?, what its outputs depend on) ----
def _marked_op(w: _Walk, eqn):
    kind = marked_kind(eqn)
    if not w.top_level:
        wname = w.weight_name(eqn.invars[1])
        raise CompileError(
            f"weight {repr(wname) if wname else 'op'} ({eqn.params['name']}) is called inside a "
            "nested jit/call; call streamtrace.nn.ops at the top level of update() (do not wrap "
            "layers in jax.jit)")
    op = MarkedOp(len(w.result.ops), kind, eqn)
    w.result.ops.append(op)
    d = {("y", op.index): (DIAG, None)}
    if kind == "elementwise":
        xd = w.get(op.x)
        _merge(d, xd, None if _shape(op.x) == _shape(op.y) else f"broadcast into {eqn.params['name']}")
    elif w.through_ops:
        wname = w.weight_name(op.w)
        label = f"the input of weight op '{wname}'" if wname else eqn.params["name"]
        _merge(d, {src: (DENSE, label) for src in w.get(op.x)})
    w.put(op.y, d)


def _is_control_flow(eqn) -> bool:
    from jax.extend.core import jaxprs_in_params
    name = eqn.primitive.name
    return name in LOOPS or (name not in CALL_PRIMITIVES and any(True for _ in jaxprs_in_params(eqn.params)))


def _control_flow(w: _Walk, eqn):
    from jax.extend.core import jaxprs_in_params
    name = eqn.primitive.name
    for sub in jaxprs_in_params(eqn.params):
        found = _contains_marked(getattr(sub, "jaxpr", sub))
        if found:
            reads = sorted(w.param_names[v] for v in eqn.invars if not isinstance(v, Literal) and v in w.param_names)
            hint = f" (the loop reads parameters: {', '.join(reads)})" if reads else ""
            raise CompileError(
                f"a weight op ({found}) sits inside control flow `{name}`{hint}. Eligibility "
                "traces need each weight op exactly once per step: unroll the loop (or branch) "
                "in update(), or move the weight out of it.")
    d = {}
    for v in eqn.invars:  # conservatively: control flow may mix neurons
        _merge(d, w.get(v), f"{name} (control flow, treated as mixing neurons)")
    for v in eqn.outvars:
        w.put(v, dict(d))


def _call(w: _Walk, eqn):
    """A nested jit / call: analysed inside, with the caller's deps on its inputs."""
    sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    sub_jaxpr = getattr(sub, "jaxpr", sub)
    sub_in = {sv: w.get(v) for sv, v in zip(sub_jaxpr.invars, eqn.invars)}
    sub_names = {sv: w.param_names[v] for sv, v in zip(sub_jaxpr.invars, eqn.invars)
                 if not isinstance(v, Literal) and v in w.param_names}
    sub_res = analyze(sub_jaxpr, sub_in, top_level=False, param_names=sub_names, through_ops=w.through_ops)
    for v, sv in zip(eqn.outvars, sub_jaxpr.outvars):
        w.put(v, dict(sub_res.deps.get(sv, {})) if not isinstance(sv, Literal) else {})


def _zero_derivative(w: _Walk, eqn):
    for v in eqn.outvars:
        w.put(v, {})


def _custom(w: _Walk, eqn):
    _custom_call(eqn, w.get, w.put, w.through_ops)


def _elementwise(w: _Walk, eqn):
    name = eqn.primitive.name
    # select_n's predicate has zero derivative
    invars = eqn.invars[1:] if name == "select_n" else eqn.invars
    for ov in eqn.outvars:
        oshape = _shape(ov)
        d = {}
        for v in invars:
            same = isinstance(v, Literal) or _shape(v) == oshape
            _merge(d, w.get(v), None if same else f"broadcast in {name}")
        w.put(ov, d)


def _shape_only(w: _Walk, eqn):
    src = eqn.invars[0]
    same_size = _size(src) == _size(eqn.outvars[0])
    w.put(eqn.outvars[0], dict(w.get(src)) if same_size else _dense(w.get(src), eqn.primitive.name))


def _mixing(w: _Walk, eqn):
    """Anything else: every output may depend densely on every input."""
    d = {}
    for v in eqn.invars:
        _merge(d, w.get(v), eqn.primitive.name)
    for v in eqn.outvars:
        w.put(v, dict(d))


# the first rule that applies wins; _mixing when none does
_RULES = (
    (lambda eqn: marked_kind(eqn) is not None, _marked_op),
    (_is_control_flow, _control_flow),
    (lambda eqn: eqn.primitive.name in CALL_PRIMITIVES and not eqn.primitive.name.startswith("custom"), _call),
    (lambda eqn: eqn.primitive.name in ZERO_DERIVATIVE, _zero_derivative),
    (is_custom, _custom),
    (lambda eqn: eqn.primitive.name in ELEMENTWISE, _elementwise),
    (lambda eqn: eqn.primitive.name in SHAPE_ONLY, _shape_only),
)


def analyze(jaxpr, in_deps: dict, *, cut: dict | None = None, top_level: bool = True,
            param_names: dict | None = None, through_ops: bool = False) -> StepAnalysis:
    """Propagate source dependencies through ``jaxpr``.

    in_deps: invar -> deps. cut: var -> source; the var's deps are replaced by that source
    (used to ask "what does the output depend on besides the new hidden state").
    param_names: invar -> parameter name, only used to name weights in errors.
    through_ops: also follow marked matmuls' inputs (as dense paths): "does this reach that
    at all", rather than "what do the traces see".
    """
    deps: dict = {}
    w = _Walk(deps, StepAnalysis(deps), cut or {}, param_names or {}, top_level, through_ops)
    for v in jaxpr.invars:
        w.put(v, dict(in_deps.get(v, {})))
    for v in jaxpr.constvars:
        w.put(v, {})
    for eqn in jaxpr.eqns:
        rule = next((rule for applies, rule in _RULES if applies(eqn)), _mixing)
        rule(w, eqn)
    return w.result


def _dense(d, why):
    out = {}
    _merge(out, d, why)
    return out


def _custom_call(eqn, get, put, through_ops):
    """A custom_jvp / custom_vjp function: element-wise only where proven so. Both the
    function itself and the derivative rule it defines (the one every algorithm and jax.grad
    use) are analysed; an output mixes neurons if either mixes them."""
    from jax.extend.core import Jaxpr
    sub = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
    sub = getattr(sub, "jaxpr", sub)
    if isinstance(sub, Jaxpr) and _contains_marked(sub):
        raise CompileError("a weight op is called inside a custom_jvp/custom_vjp function; "
                           "call it in update() directly")
    outer = [get(v) for v in eqn.invars]
    if not any(outer):  # depends on no source (also ends the recursion into rules that call themselves)
        for ov in eqn.outvars:
            put(ov, {})
        return
    label = f"{eqn.primitive.name.split('_call')[0]} function '{function_name(eqn)}'"
    closed, t_in, t_out = tangent_jaxpr(eqn)
    rule = analyze(closed.jaxpr, {tv: d for tv, d in zip(t_in, outer) if tv is not None},
                   top_level=False, through_ops=through_ops)
    prim = None
    if isinstance(sub, Jaxpr):
        prim = analyze(sub, dict(zip(sub.invars, outer)), top_level=False, through_ops=through_ops)

    def relabel(deps, what):
        out = {}
        for src, (kind, why) in deps.items():
            known = {w for d in outer for s, (k, w) in d.items() if s == src and k == DENSE}
            if kind == DENSE and why not in known:
                why = f"{label} (its {what} mixes neurons: {why})"
            out[src] = (kind, why)
        return out

    for k, ov in enumerate(eqn.outvars):
        d = {}
        tv = t_out[k]
        _merge(d, relabel({} if isinstance(tv, Literal) else rule.deps.get(tv, {}), "derivative rule"))
        if prim is not None:
            pv = sub.outvars[k]
            _merge(d, relabel({} if isinstance(pv, Literal) else prim.deps.get(pv, {}), "function"))
        put(ov, d)
