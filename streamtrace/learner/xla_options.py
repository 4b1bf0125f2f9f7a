"""XLA compiler options for the learner's compiled step (per compilation, never global).

XLA's CPU backend hands reductions to YNNPACK fusions by default (jax 0.10). For the
reductions an online step does -- a weight gradient summed over slots, (slots, I, O) ->
(I, O) -- those ran 15x slower than XLA's own loops on a 2-vCPU machine (a 64 x 260 x 256
multiply-sum: 164 ms against 9-11 ms), so the step is compiled without them.

A one-slot step is scheduled for memory, not concurrency. Its work is a few weight-sized
passes per weight (trace, moments, weight); XLA's default order puts the same pass of every
weight side by side, to run them on several threads, so a weight's arrays have left the cache
before its next pass reads them, and on one core the runtime still hands half of them to a
second thread and waits for it. With an optax optimizer (each state leaf guarded apart),
GRU-256 D-RTRL, one slot, pinned: 1.38x the limit program against 1.25-1.28x (ES-D-RTRL 1.21x
against 1.12x); GRU-64 one slot unchanged. With the default ``adam`` (in place) the order no
longer matters (1.07x either way). Steps of many slots keep the default: there it measured
0-3% slower (64 slots of GRU-256 ES-D-RTRL).
"""
from __future__ import annotations

import jax

__all__ = ["step_compiler_options"]


def step_compiler_options(slots: int = 1) -> dict:
    """Options for ``lowered.compile(compiler_options=...)`` of a step over ``slots`` slots
    on the default backend."""
    if jax.default_backend() != "cpu":
        return {}
    options = {"xla_cpu_experimental_ynn_fusion_type": ""}
    if slots == 1:
        options["xla_cpu_scheduler_type"] = "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
    return options
