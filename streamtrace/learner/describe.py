"""What a checkpoint records about the model and optimizer that wrote it.

State shapes alone do not tell a LIF with ``gain=2`` from one with ``gain=5``, nor Adam at
1e-3 from Adam at 1e-2. These descriptions hold the plain settings (numbers, strings, bools)
that the modules and the optax transforms keep, as flat JSON-safe dicts:

* ``describe_model``: per submodule path, its class name and its public plain attributes
  (``{"class": "Stack", "kind": "lif", "gain": 2.0, "cell.class": "LIF", "cell.alpha": ...}``);
  works for any brainstate module, recording only what it can read.
* ``describe_optimizer``: optax keeps its hyper-parameters in closures; they are read from
  there, per transform in chain order (``{"1.scale_by_adam.b1": 0.9, "2.scale.step_size": -0.001}``).

``checkpoint.description_diff`` compares two of them.
"""
from __future__ import annotations

import numbers

import brainstate
import numpy as np

__all__ = ["describe_model", "describe_optimizer"]

_MAX_DEPTH = 12


def _plain(v):
    """v as a JSON-safe scalar, or a tuple of them; None when it is not plain data."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    if isinstance(v, str):
        return v if len(v) <= 200 else None
    if isinstance(v, (tuple, list)) and 0 < len(v) <= 16:
        items = [_plain(x) for x in v]
        return items if all(x is not None for x in items) else None
    return None


def describe_model(model) -> dict:
    out: dict = {}
    seen: set = set()

    def walk(m, prefix, depth):
        if id(m) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(m))
        out[prefix + "class"] = type(m).__name__
        for name, v in sorted(vars(m).items()):
            if name.startswith("_") or isinstance(v, brainstate.State):
                continue
            if isinstance(v, brainstate.nn.Module):
                walk(v, f"{prefix}{name}.", depth + 1)
            elif isinstance(v, (list, tuple)) and v and all(isinstance(x, brainstate.nn.Module) for x in v):
                for i, x in enumerate(v):
                    walk(x, f"{prefix}{name}.{i}.", depth + 1)
            elif (p := _plain(v)) is not None:
                out[prefix + name] = p
    walk(model, "", 0)
    return out


def describe_optimizer(opt) -> dict:
    """Plain settings captured by an optax transform's ``update`` closure (and the closures it
    reaches: ``chain``'s parts, schedules); a custom transform gives what it captures."""
    out: dict = {}
    seen: set = set()

    def walk(fn, depth):
        if hasattr(fn, "update") and hasattr(fn, "init"):    # a GradientTransformation
            fn = fn.update
        if depth > _MAX_DEPTH or id(fn) in seen:
            return
        seen.add(id(fn))
        code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is None or not cells:
            return
        owner = fn.__qualname__.split(".<locals>")[0]
        mine, inner = {}, []
        for name, cell in zip(code.co_freevars, cells):
            try:
                v = cell.cell_contents
            except ValueError:       # an empty cell
                continue
            if callable(v) or hasattr(v, "update"):
                inner.append(v)
            elif isinstance(v, (tuple, list)) and any(callable(x) or hasattr(x, "update") for x in v):
                inner += [x for x in v if callable(x) or hasattr(x, "update")]
            elif (p := _plain(v)) is not None:
                mine[name] = p
        if mine:   # numbered in chain order: two transforms of one kind stay apart
            index = len({k.split(".", 1)[0] for k in out}) + 1
            out.update({f"{index}.{owner}.{k}": v for k, v in mine.items()})
        for v in inner:
            walk(v, depth + 1)
    walk(opt, 0)
    return out
