"""The engine's programs of one learner, exported with ``jax.export`` and compiled by IREE: the
step (``Programs._fn(None)``), its prediction twin (``Programs._fn_predict``), the label
program when the learner takes delayed labels (``Programs._fn_label``) and, over several slots,
the slot reset (``Programs._fn_reset``). Each is one IREE module named for its program."""
from __future__ import annotations

import re

import jax
import numpy as np
from jax import export

from ..learner.barriers import without_barriers
from ..learner.slotwise import without_branches
from ..learner.symmetric import by_columns
from .parts import refusal
from .tanh64 import rewrite_tanh64
from .targets import compiler_flags

__all__ = ["ExportError", "Program", "programs_of", "export_program", "compile_program"]

_MODULE = re.compile(r"^module @[\w.$-]+", re.M)


class ExportError(RuntimeError):
    """A learner or a program that cannot be exported; the message names the part and why."""


class Program:
    """One exported program: ``name`` (its module's and its file's), its StableHLO ``text``,
    input and output avals (the state buffers first), and the float64 tanh rewritten."""

    def __init__(self, name, text, ins, outs, tanh):
        self.name, self.text, self.ins, self.outs, self.tanh = name, text, tuple(ins), tuple(outs), tanh


def export_program(name: str, fn, args) -> Program:
    """``fn(*args)`` (avals or arrays) exported with ``jax.export`` as the module ``@name``, its
    float64 tanh made libm-free (tanh64.py). Every argument is kept, used or not (the runner
    passes them all).

    >>> import jax.numpy as jnp
    >>> p = export_program("double", lambda a: 2 * a, (jnp.zeros(3),))
    >>> "module @double" in p.text, [a.shape for a in p.outs]
    (True, [(3,)])
    """
    try:
        # IREE's compiler crashes on the period search in a branch, a barrier makes its host
        # wait for the device mid-step (learner/barriers.py), and it vectorises a symmetric
        # matrix's product with a vector by columns, not by rows (learner/symmetric.py)
        with without_branches(), without_barriers(), by_columns():
            exported = export.export(jax.jit(fn, keep_unused=True))(*args)
    except Exception as e:  # noqa: BLE001 - jax raises many kinds; name the part
        raise ExportError(f"the {name} program cannot be exported by jax.export ({type(e).__name__}: {e})") from e
    text, tanh = rewrite_tanh64(exported.mlir_module())
    return Program(name, _MODULE.sub(f"module @{name}", text, count=1), exported.in_avals, exported.out_avals, tanh)


def programs_of(learner) -> list:
    """The learner's exported programs: step, predict, label (``label_delay``), reset (more
    than one slot; a bank of one-slot states resets a slot with its initial state, as ``serve``'s).

    >>> from streamtrace.export.learner import learner_from_config
    >>> [p.name for p in programs_of(learner_from_config(None)[1])]
    ['step', 'predict']
    """
    p = learner.programs
    x, y, active = p.example_inputs(None)
    io = (p.avals, x, y, active, active)
    out = [export_program("step", p._fn(None), io), export_program("predict", p._fn_predict(), io)]
    if learner.label_delay:
        y1 = jax.ShapeDtypeStruct(p.out_shape, p.y_dtype)
        out.append(export_program("label", p._fn_label(), (p.avals, np.int32(0), np.int32(0), y1)))
    if learner.n > 1:
        out.append(export_program("reset", p._fn_reset(), (p.avals, np.int32(0))))
    return out


def compile_program(text: str, target: str, name: str = "step") -> bytes:
    """The IREE module (vmfb bytes) of a StableHLO program for ``target`` (targets.py); a
    compiler error is an ``ExportError`` of one line naming the program, the part of the
    learner whose code IREE refused and why (parts.py)."""
    import iree.compiler as ic
    try:
        return ic.compile_str(text, input_type="stablehlo", extra_args=compiler_flags(target))
    except ic.CompilerToolError as e:
        raise ExportError(refusal(name, target, str(e))) from None
