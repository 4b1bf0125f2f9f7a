"""D-RTRL's contraction of the learning signal with the traces, against numpy: every path
(no batch axis, a slot axis summed as an unrolled chain, a long slot axis, two batch axes,
S = 1 and S = 2, matmul and element-wise traces)."""
import jax
import numpy as np
import pytest

from streamtrace.etrace.d_rtrl import UNROLL_SLOTS, contract

CASES = [((), 5, 3, 1), ((), 5, 3, 2), ((1,), 4, 6, 1), ((7,), 4, 6, 1), ((7,), 4, 6, 2),
         ((UNROLL_SLOTS + 3,), 3, 2, 1), ((2, 3), 4, 5, 2)]


@pytest.mark.parametrize("lead,I,O,S", CASES, ids=str)
@pytest.mark.parametrize("elementwise", [False, True], ids=["matmul", "elementwise"])
def test_contract_matches_numpy(x64, lead, I, O, S, elementwise):
    rng = np.random.default_rng(1)
    g = rng.normal(size=lead + (O, S))
    e = rng.normal(size=lead + ((O, S) if elementwise else (I, O, S)))
    prod = g * e if elementwise else g[..., None, :, :] * e
    want = prod.sum(axis=-1).reshape((-1,) + prod.shape[len(lead):-1]).sum(axis=0)
    got = np.asarray(jax.jit(contract)(g, e))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
