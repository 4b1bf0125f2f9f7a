"""The per-slot finite checks of the learner step sum through products with ones (not XLA's
windowed float reductions): the sums must match numpy's and flag one bad value anywhere."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from streamtrace.learner.step import _ones_dot, _slot_sum

SHAPES = [(1, 7), (3, 7), (1, 260, 256, 1), (2, 68, 64, 1), (1, 5, 3, 2), (4, 2, 6), (1, 9, 1, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sum_per_slot_matches_numpy(x64, shape):
    a = np.random.default_rng(0).normal(size=shape)
    got = np.asarray(jax.jit(_ones_dot)(jnp.asarray(a)))
    np.testing.assert_allclose(got, a.reshape(shape[0], -1).sum(axis=1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_one_bad_value_flags_only_its_slot(shape, bad):
    a = np.ones(shape, np.float32)
    idx = tuple(s - 1 for s in shape)          # the last value of the last slot
    a[idx] = bad
    tree = {"h": jnp.ones((shape[0], 3), jnp.float32), "tr": jnp.asarray(a),
            "count": jnp.ones((shape[0], 2), jnp.int32)}
    ok = np.asarray(jax.jit(lambda t: jnp.isfinite(_slot_sum(t)))(tree))
    want = np.ones(shape[0], bool)
    want[-1] = False
    assert np.array_equal(ok, want)


def test_overflowing_sum_is_refused():
    a = np.full((2, 4, 8, 1), 3e38, np.float32)   # every value finite, their sum is not
    a[0] = 1.0
    ok = np.asarray(jax.jit(lambda t: jnp.isfinite(_slot_sum(t)))(jnp.asarray(a)))
    assert ok.tolist() == [True, False]
