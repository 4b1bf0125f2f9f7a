"""The eligibility-trace compiler: one traced step -> hidden groups, weight relations,
instant parameters, and a recorded reason for every decision."""
from __future__ import annotations

import warnings as _warnings
from dataclasses import dataclass, field

import jax
import numpy as np
from jax.extend.core import Literal

from .analysis import DENSE, DIAG, analyze
from .errors import CompileError, CompileWarning
from .interpreter import eval_jaxpr
from .model_fn import ModelFunction
from .recognise import mark_plain_weights

__all__ = ["compile_graph", "ETraceGraph", "HiddenGroup", "WeightRelation", "Decision"]


@dataclass(frozen=True)
class HiddenGroup:
    """States of one neuron that feed each other; state ``s`` of the group is ``members[s]``."""
    index: int
    members: tuple[str, ...]
    shape: tuple[int, ...]

    @property
    def name(self) -> str:
        return "+".join(self.members)

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class WeightRelation:
    """One marked op: ``y = op(x, weight[, bias])``; ``group`` is the hidden group y drives
    element-wise, or None for an instant op (no hidden state downstream)."""
    index: int
    kind: str
    weight: str | None
    bias: str | None
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    group: int | None
    fixed: bool = False    # its parameters never change: no trace, no gradient (still cut like a traced op)

    @property
    def traced(self) -> bool:
        return self.group is not None and not self.fixed

    @property
    def cut(self) -> bool:
        """Drives a hidden group: D-RTRL's diagonal approximation cuts the path through it."""
        return self.group is not None

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(p for p in (self.weight, self.bias) if p is not None)


@dataclass(frozen=True)
class Decision:
    kind: str      # "weight", "param" or "hidden"
    name: str
    verdict: str
    reason: str

    def __str__(self):
        return f"{self.kind} '{self.name}': {self.verdict} -- {self.reason}"


@dataclass
class ETraceGraph:
    model_fn: ModelFunction
    jaxpr: object
    consts: list
    in_layout: list            # per invar: ("p", name) | ("h", name) | ("a", index)
    args_treedef: object
    out_treedef: object
    out_struct: object         # shape/dtype tree of the output
    n_out: int
    hidden_outvars: list       # per hidden name (model_fn.hidden_names order)
    hidden_shapes: dict
    groups: list
    relations: list
    instant_params: tuple
    decisions: list = field(default_factory=list)
    warnings: list = field(default_factory=list)   # also in the decisions' reasons (explain())
    fixed_params: tuple = ()   # never change (a frozen parameter group): no trace, no gradient

    # -- names -------------------------------------------------------------------------
    @property
    def param_names(self):
        return self.model_fn.param_names

    @property
    def hidden_names(self):
        return self.model_fn.hidden_names

    @property
    def traced_relations(self):
        return [r for r in self.relations if r.traced]

    @property
    def trace_params(self):
        return tuple(p for r in self.traced_relations for p in r.params)

    def group_of(self, hidden_name: str) -> tuple[HiddenGroup, int]:
        for g in self.groups:
            if hidden_name in g.members:
                return g, g.members.index(hidden_name)
        raise KeyError(hidden_name)

    def init_params(self) -> dict:
        return self.model_fn.param_values()

    def init_hidden(self) -> dict:
        return self.model_fn.hidden_values()

    # -- evaluation --------------------------------------------------------------------
    def flat_inputs(self, params, hidden, args):
        arg_leaves = self.args_treedef.flatten_up_to(args)
        src = {"p": params, "h": hidden, "a": arg_leaves}
        return [src[k][n] for k, n in self.in_layout]

    def run(self, params, hidden, args, *, op_hook=None, hidden_hook=None):
        """Evaluate the step: (output, new_hidden).

        hidden_hook(name, value) -> value is applied to each new hidden value as soon as the
        step computes it, so later uses in the same step (other layers, the output) and the
        returned state all see the result; used to perturb or cut the new state.
        """
        override = {}
        if hidden_hook is not None:
            for n, var in zip(self.hidden_names, self.hidden_outvars):
                if not isinstance(var, Literal):
                    override[var] = lambda v, n=n: hidden_hook(n, v)
        outs = eval_jaxpr(self.jaxpr, self.consts, self.flat_inputs(params, hidden, args),
                          op_hook=op_hook, override=override)
        out = jax.tree_util.tree_unflatten(self.out_treedef, outs[:self.n_out])
        return out, dict(zip(self.hidden_names, outs[self.n_out:]))

    # -- diagnostics -------------------------------------------------------------------
    def explain(self, weight: str | None = None, hidden: str | None = None) -> str:
        """Why each weight / hidden state is treated as it is. Filter by a (sub)name."""
        rows = []
        for d in self.decisions:
            if weight is not None and not (d.kind in ("weight", "param") and weight in d.name):
                continue
            if hidden is not None and not (d.kind == "hidden" and hidden in d.name):
                continue
            rows.append(str(d))
        return "\n".join(rows)

    def summary(self) -> str:
        lines = [f"{len(self.groups)} hidden group(s), {len(self.traced_relations)} traced weight op(s), "
                 f"{len(self.instant_params)} instant parameter(s)"]
        return "\n".join(lines + [self.explain()])


class _Unrecognise(Exception):
    """A plain weight op recognised by ``mark_plain_weights`` that cannot carry a trace."""

    def __init__(self, name, why):
        self.name, self.why = name, why


def compile_graph(model, *example_args, fixed=()) -> ETraceGraph:
    """Trace one step of ``model.update(*example_args)`` and decide how each weight learns.

    ``fixed``: names of parameters that never change (a frozen parameter group, e.g. a fixed
    reservoir beside a learned cell): they get no trace and no gradient, which is most of the
    cost of a step for a big fixed weight. The model's hidden states must be initialised
    (``brainstate.nn.init_all_states``). Raises CompileError for models the algorithms cannot
    handle correctly.
    """
    fixed = frozenset(fixed)
    skip, notes = set(), []
    while True:
        try:
            return _compile(model, example_args, frozenset(skip), fixed)
        except _Unrecognise as e:   # leave that one a plain parameter (warned about below)
            skip.add(e.name)
            notes.append(f"parameter '{e.name}' is used as a plain weight op but cannot carry a trace: {e.why}")
        except CompileError as e:
            if not notes:
                raise
            raise CompileError(f"{e} (Also: {'; '.join(notes)}.)") from None


# ---- the compiler as passes over one _Compilation ----------------------------------------------
@dataclass
class _Compilation:
    """What the passes share: the traced step and what each pass has decided so far."""
    mf: ModelFunction
    closed: object                 # the ClosedJaxpr of one step
    jaxpr: object                  # its jaxpr, plain weight ops marked
    in_layout: list
    args_treedef: object
    out_tree: object
    n_out: int
    hidden_outvars: list           # per hidden name (mf.hidden_names order)
    var_param: dict                # invar -> parameter name
    in_deps: dict                  # hidden-state invar -> its dependency source
    recognised: dict               # parameter -> the plain op it was recognised from
    hshape: dict
    fixed: frozenset = frozenset()
    res: object = None             # analyze(): deps of every var, the marked ops
    groups: list = field(default_factory=list)
    group_of: dict = field(default_factory=dict)     # hidden index -> (group index, state index)
    drives: dict = field(default_factory=dict)       # op index -> {hidden index: (kind, why)}
    uses: dict = field(default_factory=dict)         # parameter -> [(op, role, primitive)]
    relations: list = field(default_factory=list)
    indirect: dict = field(default_factory=dict)     # untraced op -> (hidden, via) it reaches
    reaches: dict = field(default_factory=dict)      # parameter -> a hidden state it changes
    feeds: dict = field(default_factory=dict)        # group -> another group it feeds
    decisions: list = field(default_factory=list)
    warns: list = field(default_factory=list)

    @property
    def H(self):
        return self.mf.hidden_names

    def deps_of(self, var, res=None):
        return {} if isinstance(var, Literal) else (self.res if res is None else res).deps.get(var, {})

    def unless_recognised(self, name, why):
        """A recognised plain op that fails a check goes back to a plain parameter (a retry)."""
        if name in self.recognised:
            raise _Unrecognise(name, why)


def _trace(model, example_args, skip, fixed=frozenset()) -> _Compilation:
    """One step as a jaxpr; which invar is which; plain weight ops marked; dependencies."""
    mf = ModelFunction(model)
    params, hidden = mf.param_values(), mf.hidden_values()
    closed, out_shape = jax.make_jaxpr(mf, return_shape=True)(params, hidden, *example_args)
    jaxpr = closed.jaxpr

    # which invar is which: flatten the same structure with string labels as leaves
    p_labels = {n: f"p\x00{n}" for n in params}
    h_labels = {n: f"h\x00{n}" for n in hidden}
    args_treedef = jax.tree_util.tree_structure(example_args)
    a_labels = jax.tree_util.tree_unflatten(args_treedef, [f"a\x00{i}" for i in range(args_treedef.num_leaves)])
    labels = jax.tree_util.tree_leaves((p_labels, h_labels, *a_labels))
    in_layout = []
    for lab in labels:
        k, n = lab.split("\x00", 1)
        in_layout.append((k, int(n) if k == "a" else n))
    assert len(in_layout) == len(jaxpr.invars)

    out_tree, new_hidden_shapes = out_shape
    n_out = len(jax.tree_util.tree_leaves(out_tree))
    hidden_outvars_sorted = jaxpr.outvars[n_out:]
    # new_hidden is a dict: its leaves come in sorted-key order
    by_name = dict(zip(sorted(hidden), hidden_outvars_sorted))
    hidden_outvars = [by_name[n] for n in mf.hidden_names]

    var_param = {v: n for (k, n), v in zip(in_layout, jaxpr.invars) if k == "p"}
    hidden_idx = {n: i for i, n in enumerate(mf.hidden_names)}
    in_deps = {v: {("h", hidden_idx[n]): (DIAG, None)}
               for (k, n), v in zip(in_layout, jaxpr.invars) if k == "h"}
    # plain x @ W (+ b) / x * w on a parameter become marked ops (brainstate layers, plain jax)
    jaxpr, recognised = mark_plain_weights(jaxpr, {v for v, n in var_param.items() if n not in skip})
    recognised = {var_param[v]: how for v, how in recognised.items()}
    unknown = sorted(fixed - set(mf.param_names))
    if unknown:
        raise ValueError(f"fixed parameters {unknown} are not parameters of the model; it has {list(mf.param_names)}")
    c = _Compilation(mf, closed, jaxpr, in_layout, args_treedef, out_tree, n_out, hidden_outvars, var_param,
                     in_deps, recognised, {n: tuple(np.shape(hidden[n])) for n in mf.hidden_names}, fixed)
    c.res = analyze(jaxpr, in_deps, param_names=var_param)
    return c


def _group_hidden(c: _Compilation):
    """Hidden groups: union states whose new value depends element-wise on another's old value."""
    H = c.H
    parent = list(range(len(H)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, n in enumerate(H):
        for src, (kind, why) in c.deps_of(c.hidden_outvars[i]).items():
            if src[0] != "h":
                continue
            j = src[1]
            if kind == DENSE:
                raise CompileError(
                    f"hidden state '{n}' depends on the previous value of '{H[j]}' through `{why}`, "
                    "which mixes neurons and is not a marked weight op. Route recurrent weights through "
                    "streamtrace.nn.ops.matmul so the path is cut, or keep the recurrence element-wise.")
            parent[find(i)] = find(j)
    roots = {}
    for i in range(len(H)):
        roots.setdefault(find(i), []).append(i)
    for members in roots.values():
        names = tuple(H[i] for i in members)
        shapes = {c.hshape[m] for m in names}
        if len(shapes) != 1:
            raise CompileError(f"hidden states {', '.join(names)} feed each other but have different shapes "
                               f"{sorted(shapes)}; states of one neuron group must share a shape")
        g = HiddenGroup(len(c.groups), names, shapes.pop())
        for s, i in enumerate(members):
            c.group_of[i] = (g.index, s)
        c.groups.append(g)
        why = ("its states feed each other element-wise from one step to the next" if len(names) > 1
               else "no other hidden state feeds it element-wise")
        for m in names:
            c.decisions.append(Decision("hidden", m, f"group '{g.name}' (S={g.size}, shape {g.shape})", why))


def _record_uses(c: _Compilation):
    """Which group each marked op drives, and how each parameter is used at the top level."""
    c.drives = {op.index: {} for op in c.res.ops}
    for i in range(len(c.H)):
        for src, (kind, why) in c.deps_of(c.hidden_outvars[i]).items():
            if src[0] == "y":
                c.drives[src[1]][i] = (kind, why)
    c.uses = {n: [] for n in c.var_param.values()}
    op_by_eqn = {id(op.eqn): op for op in c.res.ops}
    for eqn in c.jaxpr.eqns:
        op = op_by_eqn.get(id(eqn))
        for pos, v in enumerate(eqn.invars):
            if not isinstance(v, Literal) and v in c.var_param:
                role = ("weight" if pos == 1 else "bias" if pos == 2 else "input") if op else None
                c.uses[c.var_param[v]].append((op, role, eqn.primitive.name))
    direct_outs = {v for v in c.hidden_outvars + list(c.jaxpr.outvars[:c.n_out]) if not isinstance(v, Literal)}
    for (k, n), v in zip(c.in_layout, c.jaxpr.invars):
        if k == "p" and v in direct_outs:
            c.uses[n].append((None, None, "output"))


def _op_group(c: _Compilation, op, wname, bname) -> int | None:
    """The one hidden group a marked op drives element-wise (None: it drives none)."""
    targets = c.drives[op.index]
    if not targets:
        return None
    label = wname or f"op #{op.index} ({op.eqn.params['name']})"
    dense = [(c.H[i], why) for i, (kind, why) in targets.items() if kind == DENSE]
    if dense:
        h, why = dense[0]
        c.unless_recognised(wname, f"its output reaches hidden state '{h}' through `{why}`, which is not "
                                   "element-wise")
        raise CompileError(
            f"weight '{label}': its output reaches hidden state '{h}' through `{why}`, which is not "
            "element-wise. Each output unit of a weight op must drive only its own neuron's states "
            "(y -> h element-wise); apply the op once per hidden group with matching shapes.")
    gs = sorted({c.group_of[i][0] for i in targets})
    if len(gs) > 1:
        names = [c.groups[g].name for g in gs]
        c.unless_recognised(wname, f"it drives two hidden groups ({names[0]} and {names[1]})")
        raise CompileError(
            f"weight '{label}' drives two hidden groups ({names[0]} and {names[1]}); one weight op "
            "may feed one hidden group only. Split it into one op per group.")
    group = gs[0]
    for pname, role in ((wname, "weight"), (bname, "bias")):
        if (role == "weight" and pname is None) or (role == "bias" and op.b is not None and pname is None):
            raise CompileError(
                f"the {role} of weight op #{op.index} ({op.eqn.params['name']}) is computed inside "
                "update() rather than read from a ParamState; pass the ParamState's value directly "
                "so its eligibility trace has a parameter to update.")
    if tuple(op.y.aval.shape) != c.groups[group].shape:
        c.unless_recognised(wname, f"its output shape {tuple(op.y.aval.shape)} differs from its hidden "
                                   f"group's shape {c.groups[group].shape}")
        raise CompileError(f"weight '{label}': output shape {tuple(op.y.aval.shape)} differs from its "
                           f"hidden group's shape {c.groups[group].shape}")
    return group


def _link_ops(c: _Compilation):
    """A WeightRelation per marked op; a traced weight must be used in exactly that one op."""
    for op in c.res.ops:
        wname = _lookup(c.var_param, op.w)
        bname = _lookup(c.var_param, op.b) if op.b is not None else None
        params = [p for p in (wname, bname) if p is not None]
        c.relations.append(WeightRelation(op.index, op.kind, wname, bname, tuple(op.x.aval.shape),
                                          tuple(op.y.aval.shape), _op_group(c, op, wname, bname),
                                          bool(params) and all(p in c.fixed for p in params)))
    for r in c.relations:
        for p in r.params:
            others = [u for u in c.uses[p] if u[0] is None or u[0].index != r.index]
            if r.traced and others:
                where = others[0][2] if others[0][0] is None else f"weight op #{others[0][0].index}"
                raise CompileError(
                    f"parameter '{p}' carries an eligibility trace but is also used by `{where}`; that path "
                    "would get no gradient. Use each traced weight in exactly one weight op.")


def _check_output_paths(c: _Compilation):
    """The output must reach traced weights and old hidden values only through the new hidden
    state; follow every path here, including through the inputs of instant (readout) ops."""
    cut = {v: ("hn", i) for i, v in enumerate(c.hidden_outvars) if not isinstance(v, Literal)}
    out_res = analyze(c.jaxpr, c.in_deps, cut=cut, param_names=c.var_param, through_ops=True)
    for ov in c.jaxpr.outvars[:c.n_out]:
        for src in c.deps_of(ov, out_res):
            if src[0] == "h":
                raise CompileError(
                    f"the model output depends on the previous value of hidden state '{c.H[src[1]]}' other "
                    "than through its new value (e.g. a readout of the state before the update); "
                    "compute the output from the updated state")
            if src[0] == "y" and c.relations[src[1]].traced:
                r = c.relations[src[1]]
                c.unless_recognised(r.weight, "the model output depends on it other than through the new state")
                raise CompileError(
                    f"the model output depends on weight '{r.weight}' other than through the new value of "
                    f"hidden group '{c.groups[r.group].name}'; compute the output from the updated state "
                    "(spiking layers: apply the reset at the start of the next step)")


def _find_indirect_paths(c: _Compilation):
    """Instant ops whose output still reaches a hidden state through another op's input, plain
    parameters that change a hidden state, and groups that feed another group."""
    p_deps = {v: {("p", n): (DIAG, None)} for v, n in c.var_param.items()}
    full = analyze(c.jaxpr, {**c.in_deps, **p_deps}, param_names=c.var_param, through_ops=True)
    for i, v in enumerate(c.hidden_outvars):
        for src, (_, why) in c.deps_of(v, full).items():
            if src[0] == "y" and not c.relations[src[1]].traced:
                c.indirect.setdefault(src[1], (c.H[i], why))
            elif src[0] == "p":
                c.reaches.setdefault(src[1], c.H[i])
            # another group's state (old, or new within the step) or a traced op's output
            # reaching this state: the traces of that group's weights miss this path
            gi = c.group_of[i][0]
            if src[0] == "h" and c.group_of[src[1]][0] != gi:
                c.feeds.setdefault(c.group_of[src[1]][0], c.groups[gi].name)
            elif src[0] == "y" and c.relations[src[1]].traced and c.relations[src[1]].group != gi:
                c.feeds.setdefault(c.relations[src[1]].group, c.groups[gi].name)


def _explain_weights(c: _Compilation):
    """A decision (verdict and reason) for every weight op's parameters."""
    for r in c.relations:
        shape = f"{r.kind}, x{r.x_shape} -> y{r.y_shape}"
        if r.fixed:
            verdict = f"fixed ({shape})"
            reason = "listed as fixed (a frozen parameter group): no trace, no gradient"
        elif r.traced:
            g = c.groups[r.group]
            verdict = f"eligibility trace ({shape}) into group '{g.name}' (S={g.size})"
            reason = "its output drives that group element-wise; paths through other weight ops are cut"
            if r.weight in c.recognised:
                reason += f" (recognised from a plain {c.recognised[r.weight]} on the parameter)"
            if r.group in c.feeds:
                w = (f"WARNING: group '{g.name}' feeds hidden group '{c.feeds[r.group]}' on the way to the loss; "
                     "the trace keeps no history of that path, so D-RTRL's gradient for this weight is "
                     "approximate (exact: a readout without state, e.g. Linear, or exact RTRL)")
                reason += "; " + w
                c.warns.append(f"weight '{r.weight}': {w}")
        elif r.index in c.indirect:
            h, via = c.indirect[r.index]
            verdict = f"one-step gradient ({shape})"
            reason = (f"its output reaches hidden state '{h}' only through {via}, a path the traces cut; "
                      "it gets dL_t/dW by backprop through the current step, without the history "
                      "(exact RTRL includes it)")
        else:
            verdict = f"instant ({shape})"
            reason = ("its output reaches no hidden state (e.g. a readout); it gets the exact dL_t/dW "
                      "by backprop through the step")
        for p in r.params:
            c.decisions.append(Decision("weight", p, verdict, reason))


def _instant_params(c: _Compilation) -> tuple:
    traced = {p for r in c.relations if r.traced for p in r.params}
    return tuple(n for n in c.mf.param_names if n not in traced and n not in c.fixed)


def _explain_params(c: _Compilation):
    """A decision for every parameter outside weight ops, warning where it changes a state."""
    for n in c.fixed:
        if not any(d.name == n for d in c.decisions):
            c.decisions.append(Decision("param", n, "fixed", "listed as fixed (a frozen parameter group): "
                                                             "no gradient"))
    for n in _instant_params(c):
        if any(d.name == n for d in c.decisions):
            continue
        used = sorted({u[2] for u in c.uses[n]}) or ["nothing"]
        reason = (f"used outside weight ops ({', '.join(used)}); it gets the one-step "
                  "gradient dL_t/dtheta by backprop through the step (history paths cut)")
        if n in c.reaches:
            w = (f"WARNING: it changes hidden state '{c.reaches[n]}', so the one-step gradient misses its effect "
                 "through the state's history. For an eligibility trace use it in one weight op: "
                 "streamtrace.nn.ops.matmul / elementwise, or plain x @ W (+ b) / x * w, used once")
            reason += "; " + w
            c.warns.append(f"parameter '{n}': {w}")
            # stacklevel: this pass, _compile, compile_graph, then the caller
            _warnings.warn(f"streamtrace: parameter '{n}': {w.split(': ', 1)[1]}", CompileWarning, stacklevel=4)
        c.decisions.append(Decision("param", n, "instant", reason))


# in order: each reads what the ones before it decided
_PASSES = (_group_hidden, _record_uses, _link_ops, _check_output_paths, _find_indirect_paths, _explain_weights,
           _explain_params)


def _compile(model, example_args, skip, fixed=frozenset()) -> ETraceGraph:
    c = _trace(model, example_args, skip, fixed)
    for compile_pass in _PASSES:
        compile_pass(c)
    return ETraceGraph(c.mf, c.jaxpr, list(c.closed.consts), c.in_layout, c.args_treedef,
                       jax.tree_util.tree_structure(c.out_tree), c.out_tree, c.n_out, c.hidden_outvars, c.hshape,
                       c.groups, c.relations, _instant_params(c), c.decisions, c.warns,
                       tuple(n for n in c.mf.param_names if n in c.fixed))


def _lookup(table, v):
    return None if isinstance(v, Literal) else table.get(v)
