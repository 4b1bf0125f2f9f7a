"""learner/packing.py's Layout against numpy: a state's small leaves packed into (rows, width)
buffers per dtype, each leaf flattened, zero-padded to whole rows and placed at its row, in leaf
order; whether the buffer is concatenated at once or written leaf by leaf (more than CHAIN
leaves), the buffers are the same and unpack gives every leaf back bit for bit."""
import jax
import numpy as np
import pytest

from streamtrace.learner import packing


def np_pack(leaves, width):
    """numpy's buffer: every leaf flattened, padded with zeros to a whole number of rows."""
    rows = []
    for leaf in leaves:
        flat = np.ravel(leaf)
        n = -(-flat.size // width)
        rows.append(np.concatenate([flat, np.zeros(n * width - flat.size, flat.dtype)]).reshape(n, width))
    return np.concatenate(rows, axis=0)


@pytest.mark.parametrize("n_leaves", [3, packing.CHAIN, packing.CHAIN + 5])
def test_packed_buffers_equal_numpy_and_unpack_bit_for_bit(n_leaves):
    rng = np.random.default_rng(n_leaves)
    tree = {f"a{i:02d}": rng.normal(size=(1 + i % 3, 2 + i % 5)).astype(np.float32) for i in range(n_leaves)}
    tree["k"] = np.arange(7, dtype=np.int32)
    layout = packing.Layout(tree)
    packed = jax.jit(layout.pack)(tree)
    f = layout.dtypes.index(np.dtype(np.float32))
    width = layout.widths[f]
    want = np_pack([tree[k] for k in sorted(tree) if k != "k"], width)
    np.testing.assert_array_equal(np.asarray(packed[f]), want)
    back = jax.jit(layout.unpack)(packed)
    for key, leaf in tree.items():
        np.testing.assert_array_equal(np.asarray(back[key]), leaf)
