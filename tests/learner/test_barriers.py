"""learner/barriers.py: ``hold`` is an optimisation barrier in the programs jax compiles and a
sum with zero inside ``without_barriers`` (the exported programs), the same values either way."""
from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np

from streamtrace.learner.barriers import hold, without_barriers

VALUES = np.array([1.5, -2.25, np.inf, -np.inf, np.nan, 0.0, -3e38], np.float32)


def _text(fn, *args):
    return jax.jit(fn).lower(*args).as_text()


def test_hold_is_a_barrier_for_xla_and_a_reduction_inside_without_barriers():
    fn = lambda a, b: [v * 2 for v in hold([a, b])]
    a, b = jnp.asarray(VALUES), jnp.arange(3.0)
    outside = _text(fn, a, b)
    with without_barriers():
        inside = _text(fn, a, b)
        held = [np.asarray(v) for v in jax.jit(lambda a, b: hold([a, b]))(a, b)]
    assert "optimization_barrier" in outside and "optimization_barrier" not in inside
    assert "reduce" in inside
    # the values unchanged, infinities and NaN included
    np.testing.assert_array_equal(held[0], VALUES)
    np.testing.assert_array_equal(held[1], np.arange(3.0, dtype=np.float32))
    # and the barrier is back once the block is left (the trace caches were cleared)
    assert "optimization_barrier" in _text(fn, a, b)


def test_without_barriers_is_per_thread_and_nests():
    seen = {}

    def other():
        seen["other"] = "optimization_barrier" in _text(lambda v: hold(v) + 3, jnp.ones(2))

    with without_barriers():
        with without_barriers():
            pass
        seen["inner_left"] = "optimization_barrier" in _text(lambda v: hold(v) + 4, jnp.ones(2))
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == {"inner_left": False, "other": True}
