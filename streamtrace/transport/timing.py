"""Timing a sensor's round trips against an engine or the echo floor (``bench``, bench/).

>>> us = paced(lambda: None, 3)
>>> us.shape
(3,)
"""
from __future__ import annotations

import os
import time

import numpy as np

__all__ = ["paced", "roundtrips"]


def paced(call, n: int, period_us: float = 0.0) -> np.ndarray:
    """``call()`` n times, each at its tick every ``period_us`` (the time until then slept), as
    a sensor sampling at 1e6 / period_us Hz sends; 0: each right after the last (back to
    back). Microseconds per call."""
    out = np.empty(n)
    clock = time.perf_counter
    nxt = clock()
    for i in range(n):
        if period_us:
            nxt += period_us * 1e-6
            wait = nxt - clock()
            if wait > 0:
                time.sleep(wait)
        t0 = clock()
        call()
        out[i] = clock() - t0
    return out * 1e6


def roundtrips(endpoint: str, n: int, cpu: int | None, warmup: int = 500, x=None, y=None, warm_s: float = 0.0,
               period_us: float = 0.0):
    """``n`` timed request/reply steps of one sensor (microseconds each), after ``warmup``
    untimed ones (and, with ``warm_s``, untimed steps for that many seconds first), back to
    back; with ``period_us`` the timed ones a request every that many microseconds, as a
    sensor sampling at that rate sends."""

    from .client import SensorClient
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    x = np.zeros(1, np.float32) if x is None else x
    with SensorClient(endpoint, stream="bench", timeout_s=30) as c:
        warm_until = time.monotonic() + warm_s
        while warmup and time.monotonic() < warm_until:
            c.step(x, y)
        for _ in range(warmup):
            c.step(x, y)
        out = paced(lambda: c.step(x, y), n, period_us)
    if cpu is not None:
        os.sched_setaffinity(0, set(range(os.cpu_count())))
    return out
