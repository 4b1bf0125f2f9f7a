"""A brainstate module seen as a pure function over named arrays.

``ModelFunction(model)(params, hidden, *args) -> (output, new_hidden)`` where ``params`` and
``hidden`` are flat dicts ``{name: array}``. Names come from module paths (``"0.cell.W"``), so
they are stable across processes. The module's own state values are never changed by a call.
"""
from __future__ import annotations

from dataclasses import dataclass

import brainstate
import jax

from .errors import CompileError

__all__ = ["ModelFunction", "state_name"]


def state_name(path) -> str:
    return ".".join(str(p) for p in path)


def _leaf_name(prefix: str, keypath) -> str:
    parts = [prefix] + [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in keypath]
    return ".".join(parts)


@dataclass(frozen=True)
class _StateSlot:
    state: brainstate.State
    treedef: object
    leaf_names: tuple[str, ...]


class ModelFunction:
    """Pure view of ``model.update``. Parameters may be pytrees; each leaf gets its own name."""

    def __init__(self, model: brainstate.nn.Module):
        if not isinstance(model, brainstate.nn.Module):
            raise TypeError(f"expected a brainstate.nn.Module, got {type(model).__name__}")
        self.model = model
        states = model.states()
        self._params: list[_StateSlot] = []
        self._hidden: list[_StateSlot] = []
        for path, st in states.items():
            name = state_name(path)
            if isinstance(st, brainstate.ParamState):
                target = self._params
            elif isinstance(st, brainstate.HiddenState):
                target = self._hidden
            else:
                raise CompileError(
                    f"state '{name}' is a {type(st).__name__}; streamtrace models may only hold "
                    "ParamState (weights) and HiddenState (recurrent variables). Make it one of "
                    "those, or a constant attribute.")
            leaves_kp, treedef = jax.tree_util.tree_flatten_with_path(st.value)
            if target is self._hidden and len(leaves_kp) != 1:
                raise CompileError(f"hidden state '{name}' must hold a single array, not a pytree")
            names = tuple(_leaf_name(name, kp) for kp, _ in leaves_kp)
            target.append(_StateSlot(st, treedef, names))
        if not self._hidden:
            raise CompileError("the model has no HiddenState: call brainstate.nn.init_all_states(model) "
                               "(or init_all_states(model, batch_size)) before compiling")
        self.param_names = tuple(n for s in self._params for n in s.leaf_names)
        self.hidden_names = tuple(n for s in self._hidden for n in s.leaf_names)

    def param_values(self) -> dict:
        return {n: v for s in self._params
                for n, v in zip(s.leaf_names, jax.tree_util.tree_leaves(s.state.value))}

    def hidden_values(self) -> dict:
        return {s.leaf_names[0]: s.state.value for s in self._hidden}

    def __call__(self, params: dict, hidden: dict, *args):
        slots = self._params + self._hidden
        with brainstate.StateTraceStack():
            saved = [s.state.value for s in slots]
            try:
                for s in self._params:
                    s.state.value = jax.tree_util.tree_unflatten(s.treedef, [params[n] for n in s.leaf_names])
                for s in self._hidden:
                    s.state.value = hidden[s.leaf_names[0]]
                out = self.model.update(*args)
                new_hidden = {s.leaf_names[0]: s.state.value for s in self._hidden}
            finally:
                for s, v in zip(slots, saved):
                    s.state.restore_value(v)
        return out, new_hidden
