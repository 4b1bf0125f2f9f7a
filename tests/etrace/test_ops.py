"""Marked weight ops compute exactly the plain op and stay visible in a jaxpr."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from streamtrace.nn import ops

dims = hs.integers(1, 6)


@settings(max_examples=25, deadline=None)
@given(batch=hs.lists(dims, max_size=2), i=dims, o=dims, bias=hs.booleans(), seed=hs.integers(0, 2**16))
def test_matmul_equals_plain(batch, i, o, bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(*batch, i)).astype(np.float32)
    w = rng.normal(size=(i, o)).astype(np.float32)
    b = rng.normal(size=(o,)).astype(np.float32) if bias else None
    want = x @ w + (b if bias else 0.0)
    np.testing.assert_allclose(np.asarray(ops.matmul(x, w, b)), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(batch=hs.lists(dims, max_size=2), o=dims, seed=hs.integers(0, 2**16))
def test_elementwise_equals_plain(batch, o, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(*batch, o)).astype(np.float32)
    w = rng.normal(size=(o,)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(ops.elementwise(x, w)), x * w)


def test_ops_are_marked_in_the_jaxpr():
    jaxpr = jax.make_jaxpr(lambda x, w, b, v: (ops.matmul(x, w, b), ops.matmul(x, w), ops.elementwise(v, b)))(
        jnp.ones((2, 3)), jnp.ones((3, 4)), jnp.ones(4), jnp.ones((2, 4)))
    names = [e.params.get("name") for e in jaxpr.eqns]
    assert names == [ops.MATMUL_BIAS, ops.MATMUL, ops.ELEMENTWISE]


def test_ops_have_plain_gradients():
    x, w, b = jnp.arange(6.0).reshape(2, 3), jnp.ones((3, 2)) * 0.5, jnp.array([1.0, -1.0])
    g = jax.grad(lambda w, b: jnp.sum(ops.matmul(x, w, b) ** 2), argnums=(0, 1))(w, b)
    want = jax.grad(lambda w, b: jnp.sum((x @ w + b) ** 2), argnums=(0, 1))(w, b)
    for a, c in zip(g, want):
        np.testing.assert_allclose(a, c)


@pytest.mark.parametrize("call, match", [
    (lambda: ops.matmul(jnp.ones((2, 3)), jnp.ones(3)), "2-D"),
    (lambda: ops.matmul(jnp.ones((2, 3)), jnp.ones((4, 2))), "does not match"),
    (lambda: ops.matmul(jnp.ones((2, 3)), jnp.ones((3, 2)), jnp.ones(3)), "bias"),
    (lambda: ops.elementwise(jnp.ones((2, 3)), jnp.ones(4)), "elementwise weight"),
])
def test_bad_shapes_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
