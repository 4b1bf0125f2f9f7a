"""The engine's one-slot step program, exported with ``jax.export`` and compiled by IREE."""
from __future__ import annotations

import jax
from jax import export

from .tanh64 import rewrite_tanh64
from .targets import compiler_flags

__all__ = ["ExportError", "step_program", "compile_program"]


class ExportError(RuntimeError):
    """A learner or a program that cannot be exported; the message names the part and why."""


def step_program(learner):
    """(StableHLO text, input shapes, output shapes, tanh count) of the learner's packed step
    ``(buffers..., x, y, active, learn) -> (buffers..., out vector)`` (``Programs._fn(None)``,
    the program the engine runs for one step of every slot), its float64 tanh made libm-free
    (tanh64.py). Every argument is kept, used or not (the runner passes them all).

    >>> from streamtrace.export.learner import learner_from_config
    >>> text, ins, outs, _ = step_program(learner_from_config(None)[1])
    >>> "func.func public @main" in text, len(ins) == len(outs) + 3
    (True, True)
    """
    p = learner.programs
    x, y, active = p.example_inputs(None)
    fn = jax.jit(p._fn(None), keep_unused=True)
    try:
        exported = export.export(fn)(p.avals, x, y, active, active)
    except Exception as e:  # noqa: BLE001 - jax raises many kinds; name the part
        raise ExportError(f"the step program cannot be exported by jax.export ({type(e).__name__}: {e})") from e
    text, tanh = rewrite_tanh64(exported.mlir_module())
    return text, tuple(exported.in_avals), tuple(exported.out_avals), tanh


def compile_program(text: str, target: str) -> bytes:
    """The IREE module (vmfb bytes) of a StableHLO program for ``target`` (targets.py); a
    compiler error is an ``ExportError`` carrying IREE's first error line."""
    import iree.compiler as ic
    try:
        return ic.compile_str(text, input_type="stablehlo", extra_args=compiler_flags(target))
    except ic.CompilerToolError as e:
        first = next((line for line in str(e).splitlines() if "error" in line), str(e).splitlines()[0])
        raise ExportError(f"IREE cannot compile the step program for {target}: {first.strip()}") from None
