"""What every bench file times with: a timed loop and its p50/p99 (the same definitions
``streamtrace bench`` uses), pinning a process to a CPU, and the machine line a result
table starts with. A bench file runs with bench/ on its path (``python bench/x.py``,
``pytest bench``) and imports this as ``timing``."""
from __future__ import annotations

import os
import platform
import time

import numpy as np

from streamtrace.latency import percentiles, timed

__all__ = ["percentiles", "timed", "paced", "pin", "unpin", "cpu_name", "machine_line"]


def paced(fn, n: int, period_us: float) -> np.ndarray:
    """``fn()`` n times, each call at its tick every ``period_us`` (the time until then slept;
    0: each right after the last, back to back), as a sampling sensor sends; us per call."""
    out = np.empty(n)
    nxt = time.perf_counter()
    for i in range(n):
        if period_us:
            nxt += period_us * 1e-6
            wait = nxt - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        t0 = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - t0
    return out * 1e6


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
