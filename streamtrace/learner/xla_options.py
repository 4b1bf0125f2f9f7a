"""XLA compiler options for the learner's compiled step (per compilation, never global).

XLA's CPU backend hands reductions to YNNPACK fusions by default (jax 0.10). For the
reductions an online step does -- a weight gradient summed over slots, (slots, I, O) ->
(I, O) -- those ran 15x slower than XLA's own loops on a 2-vCPU machine (timings:
docs/decisions/step-details.md), so the step is compiled without them.

A one-slot step whose optimizer is guarded leaf by leaf (an optax transform other than
``adam``) is scheduled for memory, not concurrency. Its work is a few weight-sized passes per
weight (trace, moments, weight); XLA's default order puts the same pass of every weight side
by side, to run them on several threads, so a weight's arrays have left the cache before its
next pass reads them, and on one core the runtime still hands half of them to a second thread
and waits for it. With ``optax.adam``, GRU-256 D-RTRL, one slot, pinned: 1.38x the limit
program against 1.25-1.28x (ES-D-RTRL 1.21x against 1.12x); GRU-64 and ALIF-256 unchanged.
The in-place ``adam`` (the default) keeps the default order for one slot: there it makes no
difference (GRU-64 / GRU-256 / LIF-256 / ALIF-256, both algorithms, within 2%, paired).

One step of many slots is scheduled for memory too. Its kernels are many and small (a pass
over a (slots, H) array is short), and the default order's concurrency costs
more than it gains when they share one core. Paired against the default order, pinned: 64
slots of GRU-64 ES-D-RTRL 0.86-0.93x, LIF-256 0.85-0.89x, 16 per-slot models of GRU-64
(the engine's default) 0.94-0.95x, GRU-256 and ALIF-256 0.98-1.01x. The programs with a
loop inside (micro-batches, a few busy slots' subset calls) keep the default order: there
it measured 0.95-1.03x, no gain.

Determinism: the scheduler is not only an order. The same step compiled with the two
schedulers rounded differently (an ulp, GRU-32 D-RTRL), so every program that may serve the
same slot -- the loop programs of an engine with subset calls -- gets the same options, and
the one-step program (memory-optimised with many slots) serves alone in an engine without
them (docs/decisions/determinism.md).
"""
from __future__ import annotations

import jax

__all__ = ["step_compiler_options"]


def step_compiler_options(slots: int = 1, leaf_guards: bool = False, loop: bool = False) -> dict:
    """Options for ``lowered.compile(compiler_options=...)`` of a step over ``slots`` slots on
    the default backend; ``leaf_guards``: its optimizer is applied with a guard per state leaf;
    ``loop``: the program runs its steps in a loop (a micro-batch or a subset call)."""
    if jax.default_backend() != "cpu":
        return {}
    options = {"xla_cpu_experimental_ynn_fusion_type": ""}
    if (slots == 1 and leaf_guards) or (slots > 1 and not loop):
        options["xla_cpu_scheduler_type"] = "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
    return options
