"""What every bench file times with: a timed loop and its p50/p99 (the same definitions
``streamtrace bench`` uses), pinning a process to a CPU, and the machine line a result
table starts with. A bench file runs with bench/ on its path (``python bench/x.py``,
``pytest bench``) and imports this as ``timing``."""
from __future__ import annotations

import os
import platform

from streamtrace.commands.bench import percentiles, timed
from streamtrace.transport.timing import paced

__all__ = ["percentiles", "timed", "paced", "pin", "unpin", "cpu_name", "machine_line", "step_call", "stack_step",
           "N_IN", "N_OUT"]

N_IN, N_OUT = 4, 1      # the step benches' models: 4 inputs, 1 output


def step_call(learner, x, y, steps: int | None = None):
    """A no-argument call of ``learner``'s compiled step (``programs.step(steps)``, compiled
    now) on the fixed inputs x, y, every slot active and learning; the learner's buffers are
    carried from call to call, and each call blocks until its output is on the host."""
    import numpy as np
    compiled = learner.programs.step(steps)
    active = np.ones((() if steps is None else (steps,)) + (learner.n,), bool)
    box = [learner.buffers]

    def step():
        box[0], vec = compiled(box[0], x, y, active, active)
        return np.asarray(vec)
    return step


def stack_step(kind, hidden, algo, slots, steps=1):
    """A no-argument call of the compiled step of an ``st.nn.Stack(kind, N_IN, hidden, N_OUT)``
    learner under ``algo`` with the default optimizer (``st.adam(1e-3)``: optax.adam up to
    rounding, applied in place), over ``slots`` (None: one stream) and ``steps`` steps a call,
    on fixed random inputs (``step_call``)."""
    import numpy as np

    import streamtrace as st
    learner = st.OnlineLearner(st.nn.Stack(kind, N_IN, hidden, N_OUT), np.zeros(N_IN, np.float32),
                               algorithm=algo, optimizer=st.adam(1e-3), slots=slots)
    queued = () if steps == 1 else (steps,)
    lead = queued + (() if slots is None else (slots,))
    rng = np.random.default_rng(0)
    x = rng.normal(size=lead + (N_IN,)).astype(np.float32)
    y = rng.normal(size=lead + (N_OUT,)).astype(np.float32)
    return step_call(learner, x, y, steps if steps > 1 else None)


def pin(cpu: int | None):
    """Run this process on ``cpu`` only (None or a negative number: leave it as it is)."""
    if cpu is not None and cpu >= 0:
        os.sched_setaffinity(0, {cpu})


def unpin():
    os.sched_setaffinity(0, set(range(os.cpu_count())))


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_line(*extra: str) -> str:
    """CPU model, CPU count, Python and jax versions, then ``extra`` (pinning, dispatch)."""
    import jax
    return ", ".join([cpu_name(), f"{os.cpu_count()} vCPU", f"Python {platform.python_version()}",
                      f"jax {jax.__version__}", *extra])
