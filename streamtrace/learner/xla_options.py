"""XLA compiler options for the learner's compiled step (per compilation, never global).

XLA's CPU backend hands reductions to YNNPACK fusions by default (jax 0.10). For the
reductions an online step does -- a weight gradient summed over slots, (slots, I, O) ->
(I, O) -- those ran 15x slower than XLA's own loops on a 2-vCPU machine (a 64 x 260 x 256
multiply-sum: 164 ms against 9-11 ms), so the step is compiled without them.

A one-slot step whose optimizer is guarded leaf by leaf (an optax transform other than
``adam``) is scheduled for memory, not concurrency. Its work is a few weight-sized passes per
weight (trace, moments, weight); XLA's default order puts the same pass of every weight side
by side, to run them on several threads, so a weight's arrays have left the cache before its
next pass reads them, and on one core the runtime still hands half of them to a second thread
and waits for it. With ``optax.adam``, GRU-256 D-RTRL, one slot, pinned: 1.38x the limit
program against 1.25-1.28x (ES-D-RTRL 1.21x against 1.12x); GRU-64 and ALIF-256 unchanged.
The in-place ``adam`` (the default) keeps the default order: there it made no difference for
the GRUs (1.07x either way) and made ALIF-256 ES-D-RTRL slower (60 against 50 us). Steps of
many slots keep it too: there it measured 0-3% slower (64 slots of GRU-256 ES-D-RTRL).
"""
from __future__ import annotations

import jax

__all__ = ["step_compiler_options"]


def step_compiler_options(slots: int = 1, leaf_guards: bool = False) -> dict:
    """Options for ``lowered.compile(compiler_options=...)`` of a step over ``slots`` slots on
    the default backend; ``leaf_guards``: its optimizer is applied with a guard per state leaf."""
    if jax.default_backend() != "cpu":
        return {}
    options = {"xla_cpu_experimental_ynn_fusion_type": ""}
    if slots == 1 and leaf_guards:
        options["xla_cpu_scheduler_type"] = "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
    return options
