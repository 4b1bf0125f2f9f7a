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

    @property
    def traced(self) -> bool:
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


def compile_graph(model, *example_args) -> ETraceGraph:
    """Trace one step of ``model.update(*example_args)`` and decide how each weight learns.

    The model's hidden states must be initialised (``brainstate.nn.init_all_states``).
    Raises CompileError for models the algorithms cannot handle correctly.
    """
    skip, notes = set(), []
    while True:
        try:
            return _compile(model, example_args, frozenset(skip))
        except _Unrecognise as e:   # leave that one a plain parameter (warned about below)
            skip.add(e.name)
            notes.append(f"parameter '{e.name}' is used as a plain weight op but cannot carry a trace: {e.why}")
        except CompileError as e:
            if not notes:
                raise
            raise CompileError(f"{e} (Also: {'; '.join(notes)}.)") from None


def _compile(model, example_args, skip) -> ETraceGraph:
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
    out_treedef = jax.tree_util.tree_structure(out_tree)
    hidden_outvars_sorted = jaxpr.outvars[n_out:]
    # new_hidden is a dict: its leaves come in sorted-key order
    sorted_names = sorted(hidden)
    by_name = dict(zip(sorted_names, hidden_outvars_sorted))
    hidden_outvars = [by_name[n] for n in mf.hidden_names]

    param_var = {n: v for (k, n), v in zip(in_layout, jaxpr.invars) if k == "p"}
    var_param = {v: n for n, v in param_var.items()}
    hidden_idx = {n: i for i, n in enumerate(mf.hidden_names)}
    in_deps = {v: {("h", hidden_idx[n]): (DIAG, None)}
               for (k, n), v in zip(in_layout, jaxpr.invars) if k == "h"}
    # plain x @ W (+ b) / x * w on a parameter become marked ops (brainstate layers, plain jax)
    jaxpr, recognised = mark_plain_weights(jaxpr, {v for v, n in var_param.items() if n not in skip})
    recognised = {var_param[v]: how for v, how in recognised.items()}

    def unless_recognised(name, why):
        if name in recognised:
            raise _Unrecognise(name, why)
    res = analyze(jaxpr, in_deps, param_names=var_param)
    decisions: list[Decision] = []
    H = mf.hidden_names
    hshape = {n: tuple(np.shape(hidden[n])) for n in H}

    def deps_of(var):
        return {} if isinstance(var, Literal) else res.deps.get(var, {})

    # --- hidden groups: union states whose new value depends element-wise on another's old value
    parent = list(range(len(H)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, n in enumerate(H):
        for src, (kind, why) in deps_of(hidden_outvars[i]).items():
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
    groups = []
    group_of = {}
    for members in roots.values():
        names = tuple(H[i] for i in members)
        shapes = {hshape[m] for m in names}
        if len(shapes) != 1:
            raise CompileError(f"hidden states {', '.join(names)} feed each other but have different shapes "
                               f"{sorted(shapes)}; states of one neuron group must share a shape")
        g = HiddenGroup(len(groups), names, shapes.pop())
        for s, i in enumerate(members):
            group_of[i] = (g.index, s)
        groups.append(g)
        why = ("its states feed each other element-wise from one step to the next" if len(names) > 1
               else "no other hidden state feeds it element-wise")
        for m in names:
            decisions.append(Decision("hidden", m, f"group '{g.name}' (S={g.size}, shape {g.shape})", why))

    # --- which group each marked op drives
    drives = {op.index: {} for op in res.ops}
    for i in range(len(H)):
        for src, (kind, why) in deps_of(hidden_outvars[i]).items():
            if src[0] == "y":
                drives[src[1]][i] = (kind, why)

    # --- how each parameter is used at the top level
    uses: dict[str, list] = {n: [] for n in param_var}
    op_by_eqn = {id(op.eqn): op for op in res.ops}
    for eqn in jaxpr.eqns:
        op = op_by_eqn.get(id(eqn))
        for pos, v in enumerate(eqn.invars):
            if not isinstance(v, Literal) and v in var_param:
                role = ("weight" if pos == 1 else "bias" if pos == 2 else "input") if op else None
                uses[var_param[v]].append((op, role, eqn.primitive.name))
    direct_outs = {v for v in hidden_outvars + list(jaxpr.outvars[:n_out]) if not isinstance(v, Literal)}
    for (k, n), v in zip(in_layout, jaxpr.invars):
        if k == "p" and v in direct_outs:
            uses[n].append((None, None, "output"))

    relations = []
    for op in res.ops:
        wname = _lookup(var_param, op.w)
        bname = _lookup(var_param, op.b) if op.b is not None else None
        targets = drives[op.index]
        label = wname or f"op #{op.index} ({op.eqn.params['name']})"
        group = None
        if targets:
            dense = [(H[i], why) for i, (kind, why) in targets.items() if kind == DENSE]
            if dense:
                h, why = dense[0]
                unless_recognised(wname, f"its output reaches hidden state '{h}' through `{why}`, which is not "
                                         "element-wise")
                raise CompileError(
                    f"weight '{label}': its output reaches hidden state '{h}' through `{why}`, which is not "
                    "element-wise. Each output unit of a weight op must drive only its own neuron's states "
                    "(y -> h element-wise); apply the op once per hidden group with matching shapes.")
            gs = sorted({group_of[i][0] for i in targets})
            if len(gs) > 1:
                names = [groups[g].name for g in gs]
                unless_recognised(wname, f"it drives two hidden groups ({names[0]} and {names[1]})")
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
            if tuple(op.y.aval.shape) != groups[group].shape:
                unless_recognised(wname, f"its output shape {tuple(op.y.aval.shape)} differs from its hidden "
                                         f"group's shape {groups[group].shape}")
                raise CompileError(f"weight '{label}': output shape {tuple(op.y.aval.shape)} differs from its "
                                   f"hidden group's shape {groups[group].shape}")
        rel = WeightRelation(op.index, op.kind, wname, bname, tuple(op.x.aval.shape),
                             tuple(op.y.aval.shape), group)
        relations.append(rel)

    trace_params = {p for r in relations if r.traced for p in r.params}
    for r in relations:
        for p in r.params:
            others = [u for u in uses[p] if u[0] is None or u[0].index != r.index]
            if r.traced and others:
                where = others[0][2] if others[0][0] is None else f"weight op #{others[0][0].index}"
                raise CompileError(
                    f"parameter '{p}' carries an eligibility trace but is also used by `{where}`; that path "
                    "would get no gradient. Use each traced weight in exactly one weight op.")

    # --- output must reach traced weights and old hidden values only through the new hidden
    # state; follow every path here, including through the inputs of instant (readout) ops
    cut = {v: ("hn", i) for i, v in enumerate(hidden_outvars) if not isinstance(v, Literal)}
    out_res = analyze(jaxpr, in_deps, cut=cut, param_names=var_param, through_ops=True)
    for ov in jaxpr.outvars[:n_out]:
        for src in ({} if isinstance(ov, Literal) else out_res.deps.get(ov, {})):
            if src[0] == "h":
                raise CompileError(
                    f"the model output depends on the previous value of hidden state '{H[src[1]]}' other "
                    "than through its new value (e.g. a readout of the state before the update); "
                    "compute the output from the updated state")
            if src[0] == "y" and relations[src[1]].traced:
                r = relations[src[1]]
                unless_recognised(r.weight, "the model output depends on it other than through the new state")
                raise CompileError(
                    f"the model output depends on weight '{r.weight}' other than through the new value of "
                    f"hidden group '{groups[r.group].name}'; compute the output from the updated state "
                    "(spiking layers: apply the reset at the start of the next step)")

    # --- instant ops whose output still reaches a hidden state, through another op's input
    # (parameters as sources too: which plain parameters change a hidden state)
    p_deps = {v: {("p", n): (DIAG, None)} for v, n in var_param.items()}
    full = analyze(jaxpr, {**in_deps, **p_deps}, param_names=var_param, through_ops=True)
    indirect, reaches, feeds = {}, {}, {}
    for i, v in enumerate(hidden_outvars):
        for src, (_, why) in ({} if isinstance(v, Literal) else full.deps.get(v, {})).items():
            if src[0] == "y" and not relations[src[1]].traced:
                indirect.setdefault(src[1], (H[i], why))
            elif src[0] == "p":
                reaches.setdefault(src[1], H[i])
            # another group's state (old, or new within the step) or a traced op's output
            # reaching this state: the traces of that group's weights miss this path
            gi = group_of[i][0]
            if src[0] == "h" and group_of[src[1]][0] != gi:
                feeds.setdefault(group_of[src[1]][0], groups[gi].name)
            elif src[0] == "y" and relations[src[1]].traced and relations[src[1]].group != gi:
                feeds.setdefault(relations[src[1]].group, groups[gi].name)
    warns = []

    for r in relations:
        shape = f"{r.kind}, x{r.x_shape} -> y{r.y_shape}"
        if r.traced:
            g = groups[r.group]
            verdict = f"eligibility trace ({shape}) into group '{g.name}' (S={g.size})"
            reason = "its output drives that group element-wise; paths through other weight ops are cut"
            if r.weight in recognised:
                reason += f" (recognised from a plain {recognised[r.weight]} on the parameter)"
            if r.group in feeds:
                w = (f"WARNING: group '{g.name}' feeds hidden group '{feeds[r.group]}' on the way to the loss; "
                     "the trace keeps no history of that path, so D-RTRL's gradient for this weight is "
                     "approximate (exact: a readout without state, e.g. Linear, or exact RTRL)")
                reason += "; " + w
                warns.append(f"weight '{r.weight}': {w}")
        elif r.index in indirect:
            h, via = indirect[r.index]
            verdict = f"one-step gradient ({shape})"
            reason = (f"its output reaches hidden state '{h}' only through {via}, a path the traces cut; "
                      "it gets dL_t/dW by backprop through the current step, without the history "
                      "(exact RTRL includes it)")
        else:
            verdict = f"instant ({shape})"
            reason = ("its output reaches no hidden state (e.g. a readout); it gets the exact dL_t/dW "
                      "by backprop through the step")
        for p in r.params:
            decisions.append(Decision("weight", p, verdict, reason))
    instant = tuple(n for n in mf.param_names if n not in trace_params)
    for n in instant:
        if any(d.name == n for d in decisions):
            continue
        used = sorted({u[2] for u in uses[n]}) or ["nothing"]
        reason = (f"used outside weight ops ({', '.join(used)}); it gets the one-step "
                  "gradient dL_t/dtheta by backprop through the step (history paths cut)")
        if n in reaches:
            w = (f"WARNING: it changes hidden state '{reaches[n]}', so the one-step gradient misses its effect "
                 "through the state's history. For an eligibility trace use it in one weight op: "
                 "streamtrace.nn.ops.matmul / elementwise, or plain x @ W (+ b) / x * w, used once")
            reason += "; " + w
            warns.append(f"parameter '{n}': {w}")
            _warnings.warn(f"streamtrace: parameter '{n}': {w.split(': ', 1)[1]}", CompileWarning, stacklevel=3)
        decisions.append(Decision("param", n, "instant", reason))

    return ETraceGraph(mf, jaxpr, list(closed.consts), in_layout, args_treedef, out_treedef, out_tree, n_out,
                       hidden_outvars, hshape, groups, relations, instant, decisions, warns)


def _lookup(table, v):
    return None if isinstance(v, Literal) else table.get(v)
