"""The runner's ``.npz`` reader (runner/streamtrace_runner/npz.py) against ``numpy.load``, the
oracle, on archives numpy writes: the same names, dtypes, shapes and values, arrays writable;
what it does not read (compressed members, a bare .npy, damaged bytes) answered None, so the
caller falls back to numpy; and a damaged checkpoint still refused by ``read_checkpoint``."""
from __future__ import annotations

import io

import numpy as np
import pytest

from streamtrace_runner import npz
from streamtrace_runner.checkpoints import CheckpointError, checkpoint_bytes, loads_checkpoint

ARRAYS = {"w": np.arange(12.0).reshape(3, 4), "f32": np.linspace(-1, 1, 5, dtype=np.float32),
          "i": np.array([[1, -2], [3, 4]], np.int32), "flags": np.array([True, False, True]),
          "scalar": np.float64(2.5), "empty": np.zeros((0, 3)), "i64": np.array([1 << 40], np.int64),
          "nan": np.array([np.nan, np.inf, -0.0])}


def _savez(save=np.savez, **arrays) -> bytes:
    buf = io.BytesIO()
    save(buf, **arrays)
    return buf.getvalue()


def test_it_reads_what_numpy_writes_as_numpy_does(tmp_path):
    raw = _savez(**ARRAYS)
    path = tmp_path / "a.npz"
    path.write_bytes(raw)
    with np.load(path, allow_pickle=False) as z:
        oracle = {k: z[k] for k in z.files}
    for got in (npz.read(path), npz.read(io.BytesIO(raw)), npz.read(str(path))):
        assert set(got) == set(oracle)
        for k, v in oracle.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            np.testing.assert_array_equal(got[k], v, err_msg=k)
            assert got[k].flags.writeable, k
    got = npz.read(path)
    got["w"][0, 0] = 7.0          # the arrays' own memory: writing one leaves the others
    assert got["w"][0, 0] == 7.0 and got["f32"][0] == np.float32(-1)


@pytest.mark.parametrize("raw", [_savez(np.savez_compressed, **ARRAYS), b"", b"PK\x05\x06 short",
                                 b"\x93NUMPY not an archive"])
def test_what_it_does_not_read_is_none(raw):
    assert npz.read(io.BytesIO(raw)) is None


def test_a_flipped_byte_is_none_and_the_checkpoint_refused():
    raw = bytearray(checkpoint_bytes({"w": np.arange(64.0)}, {"model": "m"}))
    assert npz.read(io.BytesIO(bytes(raw)))["w"].tolist() == list(np.arange(64.0))
    at = bytes(raw).find(np.arange(64.0).tobytes()) + 100        # inside w's values
    raw[at] ^= 0x10
    assert npz.read(io.BytesIO(bytes(raw))) is None
    with pytest.raises(CheckpointError, match="unreadable|checksum"):
        loads_checkpoint(bytes(raw), "damaged")


def test_a_member_size_past_the_end_of_the_file_is_none():
    # a damaged central directory claiming a member far larger than the file: refused before
    # any buffer of that size is made
    raw = bytearray(_savez(w=np.arange(8.0)))
    entry = bytes(raw).rfind(b"PK\x01\x02")
    raw[entry + 20:entry + 28] = (1 << 31).to_bytes(4, "little") * 2      # compressed, uncompressed size
    assert npz.read(io.BytesIO(bytes(raw))) is None         # (then read by numpy.load, as it can)
