"""``sym_matvec``: P r of a symmetric P, by rows for XLA and by columns inside ``by_columns``
(the exported programs), each equal to numpy's product; and the RLS readout's P, which it is
given, stays symmetric bit for bit through updates."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamtrace as st
from streamtrace import nn
from streamtrace.learner.symmetric import by_columns, sym_matvec


def symmetric(rng, *shape):
    A = rng.standard_normal(shape)
    return A + np.swapaxes(A, -1, -2)


@pytest.mark.parametrize("columns", [False, True], ids=["rows", "columns"])
def test_product_equals_numpys_for_a_batch_of_symmetric_matrices(x64, columns):
    rng = np.random.default_rng(0)
    P, r = symmetric(rng, 3, 2, 37, 37), rng.standard_normal((3, 1, 37))     # r broadcast over axis 1
    want = np.einsum("nkij,nkj->nki", P, np.broadcast_to(r, (3, 2, 37)))
    if columns:
        with by_columns():
            got = jax.jit(sym_matvec)(jnp.asarray(P), jnp.asarray(r))
    else:
        got = jax.jit(sym_matvec)(jnp.asarray(P), jnp.asarray(r))
    assert got.shape == (3, 2, 37)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


def test_the_column_form_is_a_sum_over_rows_of_p_not_a_dot(x64):
    """Inside ``by_columns`` the traced program sums P's rows (a reduce), outside it is a
    matrix-vector product; a non-symmetric P tells the two apart (P' r against P r)."""
    P, r = jnp.array([[1.0, 2.0], [0.0, 1.0]]), jnp.array([1.0, 1.0])
    assert "dot_general" in jax.jit(sym_matvec).lower(P, r).as_text()
    assert sym_matvec(P, r).tolist() == [3.0, 1.0]
    with by_columns():
        text = jax.jit(sym_matvec).lower(P, r).as_text()
        assert sym_matvec(P, r).tolist() == [1.0, 3.0]
    assert "dot_general" not in text and "reduce" in text


@pytest.mark.parametrize("lam", [1.0, 0.98])
def test_the_readouts_p_stays_symmetric_bit_for_bit(x64, lam):
    """300 updates of two readouts (two ridges) on a reservoir's features: P equals its
    transpose exactly, as the column form in the exported programs needs."""
    L = st.OnlineLearner(nn.Reservoir(1, 40, seed=1), np.zeros(1), optimizer=st.frozen(),
                         readout=st.rls(1, lam=lam, delta=(1e-4, 1e-1)))
    P0 = np.asarray(L.state_dict()["readout.P"])
    rng = np.random.default_rng(3)
    xs = np.sin(np.arange(300) * 0.37) + 0.1 * rng.standard_normal(300)
    for t in range(299):
        L.step(xs[t:t + 1], xs[t + 1:t + 2])
    P = np.asarray(L.state_dict()["readout.P"])
    assert np.abs(P - P0).max() > 1.0                                         # it has learned
    np.testing.assert_array_equal(P, np.swapaxes(P, -1, -2))
