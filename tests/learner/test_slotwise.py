"""learner/slotwise.py: a slot-wise function under vmap gives what vmap of it gives, run once on
the folded slots (one call, no batching inside: a branch stays a branch); when_due against a
numpy oracle, with and without branches."""
import jax
import jax.numpy as jnp
import numpy as np

from streamtrace.learner.slotwise import apart, slotwise, when_due, without_branches


def _step(s, x):
    """A slot-wise step with a reduction over each slot's own row and a slot-dependent branch."""
    due = x[:, 0] > 0
    s = when_due(lambda due, s: {"y": jnp.where(due[:, None], s["y"] + jnp.sum(s["y"], 1, keepdims=True), s["y"])},
                 due, s)
    return {"y": s["y"] * x}, jnp.max(s["y"], axis=1)


def _primitives(jaxpr) -> set:
    """The primitives' names in ``jaxpr`` and every jaxpr inside it (branches, calls)."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= _primitives(inner)
    return names


def test_folded_equals_vmap_of_the_plain_function():
    rng = np.random.default_rng(0)
    s = {"y": jnp.asarray(rng.normal(size=(3, 2, 4)))}          # 3 mapped copies of 2 slots
    x = jnp.asarray(rng.normal(size=(3, 2, 4)))
    want = jax.vmap(_step)(s, x)
    got = jax.jit(jax.vmap(slotwise(_step)))(s, x)
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # an unmapped argument (the same x for every copy) is broadcast to the copies
    got = jax.vmap(slotwise(_step), in_axes=(0, None))(s, x[0])
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(jax.vmap(_step, in_axes=(0, None))(s, x[0])[1]))


def test_the_branch_stays_a_branch_under_vmap_and_goes_without_branches():
    s, x = {"y": jnp.ones((3, 2, 4))}, jnp.ones((3, 2, 4))
    assert "cond" not in _primitives(jax.make_jaxpr(jax.vmap(_step))(s, x).jaxpr)      # vmap: a select
    assert "cond" in _primitives(jax.make_jaxpr(jax.vmap(slotwise(_step)))(s, x).jaxpr)
    with without_branches():
        assert "cond" not in _primitives(jax.make_jaxpr(jax.vmap(slotwise(_step)))(s, x).jaxpr)


def test_when_due_against_numpy():
    y = np.arange(6.0).reshape(3, 2)
    due = np.array([True, False, True])
    want = np.where(due[:, None], y + y.sum(1, keepdims=True), y)
    bump = lambda due, s: {"y": jnp.where(due[:, None], s["y"] + jnp.sum(s["y"], 1, keepdims=True), s["y"])}
    np.testing.assert_array_equal(np.asarray(when_due(bump, jnp.asarray(due), {"y": jnp.asarray(y)})["y"]), want)
    none = np.zeros(3, bool)
    np.testing.assert_array_equal(np.asarray(when_due(bump, jnp.asarray(none), {"y": jnp.asarray(y)})["y"]), y)
    with without_branches():
        np.testing.assert_array_equal(np.asarray(when_due(bump, jnp.asarray(due), {"y": jnp.asarray(y)})["y"]), want)


def test_apart_is_fn_either_way_the_branch_goes_and_a_branch_only_with_branches():
    """apart's predicate (is the first operand's first value NaN) never changes the answer:
    a * b + c by hand for a NaN and a finite first value; a branch in the trace, none inside
    without_branches."""
    fn = lambda a, b, c: a * b + c
    b, c = np.array([2.0, -3.0], np.float32), np.array([0.5, 4.0], np.float32)
    for a in (np.array([1.5, 2.0], np.float32), np.array([np.nan, 2.0], np.float32)):
        got = np.asarray(jax.jit(apart, static_argnums=0)(fn, a, b, c))
        np.testing.assert_array_equal(got, np.array([a[0] * 2.0 + 0.5, 2.0 * -3.0 + 4.0], np.float32))
    assert "cond" in _primitives(jax.make_jaxpr(lambda *v: apart(fn, *v))(a, b, c).jaxpr)
    with without_branches():
        assert "cond" not in _primitives(jax.make_jaxpr(lambda *v: apart(fn, *v))(a, b, c).jaxpr)
