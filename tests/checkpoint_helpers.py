"""What the checkpoint tests share: the learners and data (also run verbatim in a fresh
process), state snapshots and comparisons, and the fixtures."""
import errno
import json
import logging
import os
import re
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace.engine import EngineCore, load_config
from streamtrace.learner import CheckpointDir, CheckpointError, read_checkpoint, write_checkpoint
from streamtrace.learner.describe import describe_model, describe_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402

TESTS_DIR = Path(__file__).resolve().parent

# The learner and the data, shared verbatim by this process and the fresh one.
COMMON = textwrap.dedent('''
    import numpy as np
    import optax
    import streamtrace as st
    from streamtrace import nn
    from models import CellNet

    N_IN, N_HIDDEN, N_OUT, STEPS, CUT = 3, 6, 2, 100, 50

    def make_learner(n_hidden=N_HIDDEN, algorithm="d-rtrl", optimizer=None, **kw):
        model = CellNet(nn.GRUCell, n_in=N_IN, n_hidden=n_hidden, n_out=N_OUT, seed=0)
        return st.OnlineLearner(model, np.zeros(N_IN, np.float32), algorithm=algorithm,
                                optimizer=optax.adam(1e-2) if optimizer is None else optimizer, **kw)

    def make_data(steps=STEPS, n_in=N_IN, n_out=N_OUT):
        rng = np.random.default_rng(1234)
        xs = rng.normal(size=(steps, n_in)).astype(np.float32)
        t = np.arange(steps, dtype=np.float32)[:, None]
        ys = np.sin(0.3 * t + np.arange(n_out, dtype=np.float32)).astype(np.float32)
        return xs, ys
''')
_ns: dict = {}
exec(COMMON, _ns)
make_learner, make_data = _ns["make_learner"], _ns["make_data"]
STEPS, CUT, N_IN = _ns["STEPS"], _ns["CUT"], _ns["N_IN"]


def snapshot(learner) -> dict:
    return {k: np.array(v, copy=True) for k, v in learner.state_dict().items()}


def assert_same_state(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert np.array_equal(a[k], b[k], equal_nan=True), f"state '{k}' differs"


@pytest.fixture(scope="module")
def base():
    """A learner trained 20 steps (tests reset it to this state before use) and its state."""
    learner = make_learner()
    xs, ys = make_data()
    for t in range(20):
        learner.step(xs[t], ys[t])
    return learner, snapshot(learner)


@pytest.fixture
def learner(base):
    L, state = base
    L.load_state_dict(state)
    return L


# The learning-quality learner (normaliser, RLS readout, parameter groups, multi-step forecast)
# and its data, shared verbatim by this process and the fresh one.
QUALITY_COMMON = textwrap.dedent('''
    import numpy as np
    import optax
    import streamtrace as st
    from streamtrace import nn

    STEPS, CUT = 60, 30

    def make_learner(horizon=3, warmup=10):
        groups = st.param_groups(recurrent=("W", None), inputs=("W_in", optax.adam(1e-2)),
                                 rest=("*", optax.sgd(1e-2, momentum=0.9)))
        return st.OnlineLearner(nn.Reservoir(2, 12, leak=0.7, seed=5), np.zeros(2, np.float32), slots=2,
                                mode=st.Forecast(channels=(0,), horizon=horizon), optimizer=groups,
                                readout=st.rls(lam=0.99, delta=1e-2),
                                transform=st.chain(st.normalise(warmup=warmup, rate=0.01), st.residual()),
                                window=20)

    def make_data():
        t = np.arange(STEPS)[:, None]
        rng = np.random.default_rng(11)
        level = 40 + 10 * np.sin(0.21 * t + np.array([0.0, 1.0]))      # two streams
        exo = rng.normal(size=(STEPS, 2))
        return np.stack([level, exo], axis=2).astype(np.float32)        # (STEPS, slots, 2)
''')
_qns: dict = {}
exec(QUALITY_COMMON, _qns)
make_quality_learner, make_quality_data = _qns["make_learner"], _qns["make_data"]
Q_STEPS, Q_CUT = _qns["STEPS"], _qns["CUT"]


# A small LIF learner for the damage and recorded-settings tests.
def _learner(gain=2.0, optimizer=None, clip=None, tau=None):
    model = st.nn.Stack("lif", 2, 4, 2, gain=gain)
    if tau is not None:
        model.cell = st.nn.LIF(4, tau=tau)
    return st.OnlineLearner(model, np.zeros(2, np.float32), mode="supervised", clip=clip,
                            optimizer=optimizer or optax.adam(1e-3))


def _train(learner, steps, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        learner.step(rng.normal(size=2).astype(np.float32), rng.normal(size=2).astype(np.float32))
    return {k: np.array(v, copy=True) for k, v in learner.state_dict().items()}


def _same(a, b):
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def _zip_regions(raw: bytes):
    """(local headers + data, central directory, end record) byte ranges of a zip file."""
    eocd = raw.rfind(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack("<II", raw[eocd + 12:eocd + 20])
    assert cd_offset + cd_size == eocd
    return range(0, cd_offset), range(cd_offset, eocd), range(eocd, len(raw))



def run_in_fresh_process(script: str, out, tmp_path) -> dict:
    """Run ``script`` in a new Python process (nothing shared with this one but the files) and
    return the arrays it saved to ``out``."""
    env = dict(os.environ, JAX_PLATFORMS=jax.default_backend())
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(out, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
