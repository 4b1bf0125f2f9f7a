"""A call's inputs cross as one byte buffer (learner/inputs.py): taken apart inside the program
they must be the arrays that went in, bit for bit, whatever their dtypes and shapes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import streamtrace as st
from streamtrace.learner.inputs import PackedInputs


def _odd_arrays():
    f = np.array([[1.5, -0.0, np.nan, np.inf], [-np.inf, 3e-45, -7.25, 1e38]], np.float32)  # 3e-45: subnormal
    return [f, np.array([True, False, True]), np.array(-123456789, np.int32),
            np.arange(5, dtype=np.uint8), np.array([[2**31 - 1, -2**31]], np.int32)]


def test_unpacked_inputs_are_the_packed_arrays_bit_for_bit():
    arrays = _odd_arrays()
    packed = PackedInputs(arrays)
    io = packed.pack(*arrays)
    assert io.dtype == np.uint8 and io.ndim == 1
    out = jax.jit(lambda b: packed.unpack(b))(io)
    for a, o in zip(arrays, out):
        o = np.asarray(o)
        assert o.shape == a.shape and o.dtype == a.dtype
        assert o.tobytes() == a.tobytes()       # NaN, -0.0 and the subnormal included


def test_filled_views_are_the_buffer_and_other_arrays_are_copied_in():
    arrays = _odd_arrays()
    packed = PackedInputs(arrays)
    for v, a in zip(packed.views, arrays):      # the engine's way: fill the views in place
        v[...] = a
    assert packed.pack(*packed.views) is packed.buffer
    out = jax.jit(lambda b: packed.unpack(b))(packed.buffer)
    assert all(np.asarray(o).tobytes() == a.tobytes() for o, a in zip(out, arrays))
    packed.pack(*[np.zeros_like(a) for a in arrays])   # a caller's own arrays: copied in
    assert not packed.buffer.any()


def test_a_wrong_shape_or_count_is_refused_not_broadcast_and_the_buffer_is_kept():
    x, mask = np.arange(8, dtype=np.float32).reshape(2, 4), np.array([True, False])
    packed = PackedInputs([x, mask])
    packed.pack(x, mask)
    before = packed.buffer.copy()
    with pytest.raises(ValueError, match=r"input 0 has shape \(4,\).*\(2, 4\)"):
        packed.pack(x[0], mask)            # numpy alone would broadcast it into both rows
    with pytest.raises(TypeError, match="takes 2 inputs; got 1"):
        packed.pack(x)
    assert np.array_equal(packed.buffer, before)


def test_float64_input_without_x64_crosses_as_jax_would_convert_it():
    x = np.array([0.1, 1 / 3, 1e-40], np.float64)     # not exact in float32; 1e-40 subnormal there
    packed = PackedInputs([x])
    assert packed.views[0].dtype == np.float32
    got = np.asarray(jax.jit(lambda b: packed.unpack(b)[0])(packed.pack(x)))
    np.testing.assert_array_equal(got, np.asarray(jnp.asarray(x)))


@pytest.mark.parametrize("slots", [None, 3])
def test_a_step_fed_through_its_input_views_equals_one_fed_copies(slots):
    """The engine fills the program's input views in place; a user's step passes its own
    arrays. Both must run the same step (same bits)."""
    def learner():
        return st.OnlineLearner(st.nn.Stack("gru", 2, 8, 1), np.zeros(2, np.float32), slots=slots)
    a, b = learner(), learner()
    lead = () if slots is None else (slots,)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x, y = rng.normal(size=lead + (2,)).astype(np.float32), rng.normal(size=lead + (1,)).astype(np.float32)
        on = np.ones(a.n, bool)
        a.buffers, vec_a = a.programs.run(a.buffers, x, y, on, on)
        views = b.programs.step().inputs.views
        views[0][...], views[1][...], views[2][...], views[3][...] = x, y, on, on
        b.buffers, vec_b = b.programs.run(b.buffers, *views)
        assert vec_a.tobytes() == vec_b.tobytes()
    for k, v in a.state_dict().items():
        assert np.asarray(v).tobytes() == np.asarray(b.state_dict()[k]).tobytes(), k
