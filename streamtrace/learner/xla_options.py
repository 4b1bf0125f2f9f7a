"""XLA compiler options for the learner's compiled step (per compilation, never global).

XLA's CPU backend hands reductions to YNNPACK fusions by default (jax 0.10). For the
reductions an online step does -- a weight gradient summed over slots, (slots, I, O) ->
(I, O) -- those ran 15x slower than XLA's own loops on a 2-vCPU machine (a 64 x 260 x 256
multiply-sum: 164 ms against 9-11 ms), so the step is compiled without them.
"""
from __future__ import annotations

import jax

__all__ = ["step_compiler_options"]


def step_compiler_options() -> dict:
    """Options for ``lowered.compile(compiler_options=...)`` on the default backend."""
    if jax.default_backend() != "cpu":
        return {}
    return {"xla_cpu_experimental_ynn_fusion_type": ""}
