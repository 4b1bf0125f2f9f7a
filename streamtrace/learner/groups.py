"""Parameter groups: optimizer settings per named group of weights, with optax's own
``multi_transform`` over the real parameter names.

    groups = param_groups(readout=("out.*", optax.adam(1e-2)),
                          input=("inp.*", None),               # None: frozen, never moves
                          rest=("*", optax.adam(1e-3)))

Patterns are ``fnmatch`` patterns over the parameter names the compiler reports
(``learner.algo.graph.param_names``); the first group whose pattern matches takes the weight.
Each group's weights are packed into one block of their own, so the optimizer still runs as a
few fused kernels per group, and a frozen group costs no optimizer work at all.
"""
from __future__ import annotations

import fnmatch

import jax
import numpy as np
import optax

from ..etrace.model_fn import ModelFunction
from .packing import Layout, path_name

__all__ = ["ParamGroups", "param_groups", "ParamStore", "frozen_params"]


class ParamGroups(optax.GradientTransformation):
    """An optax transform (``optax.multi_transform`` of the groups' transforms over the
    parameters' names, nested dict keys joined by "."; a frozen group ``set_to_zero``) that
    the learner takes apart to store each group's weights as a block of its own."""

    def __new__(cls, groups: dict):
        if not groups:
            raise ValueError("param_groups: give at least one group")
        checked = {}
        for name, spec in groups.items():
            if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str)):
                raise TypeError(f"param_groups: group {name!r} must be (pattern, optax transform or None)")
            pattern, tx = spec
            if tx is not None and not isinstance(tx, optax.GradientTransformation):
                raise TypeError(f"param_groups: group {name!r}: {type(tx).__name__} is not an optax transform")
            checked[name] = (pattern, tx)
        txs = {g: optax.set_to_zero() if tx is None else tx for g, (_, tx) in checked.items()}
        inner = optax.multi_transform(txs, lambda params: _labels(checked, params))
        self = super().__new__(cls, inner.init, inner.update)
        self.groups = checked
        return self

    def group_of(self, name: str) -> str:
        """The group whose pattern first matches parameter ``name``."""
        return _group_of(self.groups, name)

    def assign(self, names) -> dict:
        """{group: [parameter names]}; every parameter must fall in a group."""
        out = {g: [] for g in self.groups}
        for n in names:
            out[self.group_of(n)].append(n)
        return {g: ns for g, ns in out.items() if ns}

    def describe(self) -> dict:
        return {g: p for g, (p, _) in self.groups.items()}


def _group_of(groups: dict, name: str) -> str:
    for g, (pattern, _) in groups.items():
        if fnmatch.fnmatchcase(name, pattern):
            return g
    raise ValueError(f"param_groups: parameter {name!r} matches no group pattern "
                     f"{[p for p, _ in groups.values()]}; add a catch-all ('*')")


def _labels(groups: dict, params):
    """Each parameter's group, by its name (the keys on its path, joined by ".")."""
    return jax.tree_util.tree_map_with_path(lambda path, _: _group_of(groups, path_name(path)), params)


def param_groups(**groups) -> ParamGroups:
    """Optimizer settings per named group of weights.

    Each group is ``name=(pattern, transform)``: an ``fnmatch`` pattern over the parameter names
    (``learner.params``) and an optax transform, or None to freeze the group. The first group
    whose pattern matches takes a weight. Use it for a faster readout than the recurrent
    layers, or a frozen input layer.

    Parameters
    ----------
    **groups : tuple of (str, optax.GradientTransformation or None)
        The groups, in order of precedence; every weight must match one.

    Returns
    -------
    ParamGroups
        An optax transform over ``{parameter name: array}`` (optax's ``multi_transform``),
        which the learner stores a block per group.

    Examples
    --------
    >>> import numpy as np, streamtrace as st
    >>> groups = st.param_groups(readout=("out.*", st.adam(1e-2)), fixed=("cell.n.*", None),
    ...                          rest=("*", st.adam(1e-3)))
    >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
    >>> learner = st.OnlineLearner(model, np.zeros(1, np.float32), optimizer=groups)
    >>> before = learner.params
    >>> _ = learner.step(np.ones(1, np.float32), np.ones(1, np.float32))
    >>> after = learner.params
    >>> bool((after["out.b"] != before["out.b"]).all()), bool((after["cell.n.W"] == before["cell.n.W"]).all())
    (True, True)
    """
    return ParamGroups(groups)


def frozen_params(model, groups: ParamGroups | None) -> tuple:
    """The names of the model's parameters in a frozen group (transform None): the algorithm
    gives them no trace and no gradient, which for a fixed reservoir beside a learned cell is
    most of the step (its 200 x 200 recurrent weight's trace)."""
    if groups is None:
        return ()
    names = ModelFunction(model).param_names
    return tuple(n for n in names if groups.groups[groups.group_of(n)][1] is None)


# a model with a weight of at least this many values keeps its weights as arrays of their own
SEPARATE_FROM = 32768


class ParamStore:
    """The weights as the learner stores them: one packed block (no groups), one block per
    group, or (``separate``) one array per weight; ``pack``/``unpack`` convert to and from
    ``{parameter name: array}``. The state's names are the same either way."""

    def __init__(self, params: dict, groups: ParamGroups | None = None, separate: bool = False):
        self.groups = groups
        # weights that never change (a frozen model) need no block for an optimizer: kept as
        # arrays of their own, a step neither copies a block nor slices weights out of it.
        # Big weights likewise: a matmul cannot read a slice of the block in place, and the
        # copy of a (260, 256) slice costs more than the optimizer's few extra kernels and
        # buffers (GRU-256 ES-D-RTRL, 1 slot: step / limit 1.44 -> 1.24); small ones stay
        # packed, where those extra kernels dominate (GRU-64: 1.2 -> 2.2 if separate)
        big = max((int(np.size(v)) for v in params.values()), default=0) >= SEPARATE_FROM
        self.separate = (separate or big) and groups is None
        if groups is None:
            self.layouts = {None: Layout(params)}
            self.members = {None: sorted(params)}
        else:
            self.members = groups.assign(sorted(params))
            self.layouts = {g: Layout({n: params[n] for n in ns}) for g, ns in self.members.items()}
        self.frozen = [] if groups is None else [g for g in self.members if groups.groups[g][1] is None]

    def fixed_leaves(self, names, frozen: bool) -> list[str]:
        """Which of the state's leaves (``names``) hold weights no step changes: all the
        weights of a ``frozen`` model, else the blocks of the frozen groups."""
        if frozen:
            return [n for n in names if n == "params" or n.startswith("params.")]
        return [f"params.{g}" for g in self.frozen if f"params.{g}" in names]

    def pack(self, params: dict):
        if self.separate:
            return dict(params)
        if self.groups is None:
            return self.layouts[None].pack(params)[0]
        return {g: lay.pack({n: params[n] for n in self.members[g]})[0] for g, lay in self.layouts.items()}

    def unpack(self, stored) -> dict:
        if self.separate:
            return dict(stored)
        if self.groups is None:
            return self.layouts[None].unpack((stored,))
        out = {}
        for g, lay in self.layouts.items():
            out.update(lay.unpack((stored[g],)))
        return out

    def optimizer(self, base: optax.GradientTransformation | None):
        if self.groups is None:
            return base
        txs = {g: (optax.set_to_zero() if self.groups.groups[g][1] is None else self.groups.groups[g][1])
               for g in self.members}
        return optax.multi_transform(txs, {g: g for g in self.members})

    def block_of(self, name: str, shape: tuple):
        """The group layout a state leaf holds a block of (by its name's last part), or None."""
        if self.separate or not (name == "params" or name == "acc" or name.startswith(("params.", "acc.", "opt"))):
            return None
        if self.groups is None:
            lay = self.layouts[None]
            return (None, lay) if tuple(shape[-2:]) == lay.shapes[0] else None
        g = name.rsplit(".", 1)[-1]
        lay = self.layouts.get(g)
        return (g, lay) if lay is not None and tuple(shape[-2:]) == lay.shapes[0] else None
