"""The refusal audit of ``streamtrace export``: every kind of learner ``serve`` runs exports
(the default; GRU / LSTM / RNN / leaky / rotation / reservoir stacks; LIF / ALIF spiking; the
RLS readout with adaptive forgetting; the transforms and the screen; experts with a seasonal
period or its detection; the trace algorithms; horizon; delayed labels), and its runner's
predictions equal the jax learner's (the oracle) over Mackey-Glass steps within the two
compilers' rounding; a part IREE cannot compile is refused in one line naming it
(export/parts.py). The table is in docs/devices.md ("What exports")."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from streamtrace.evaluation.tasks import mackey_glass
from streamtrace.export.learner import learner_from_config
from streamtrace.export.program import ExportError, compile_program, export_program
from streamtrace.export.runner import Runner
from streamtrace.export.write import export_learner

S = '[model]\nstack = "{}"\nn_hidden = 8\n'
RES = '[model]\nstack = "reservoir"\nn_hidden = 20\nprecision = 64\n[readout]\nkind = "rls"\n[learning]\noptimizer = "frozen"\n'
# name -> config (None: the default learner); small models: each export compiles in 5-25 s here
CATALOGUE = {
    "default": None,
    "gru": S.format("gru"), "lstm": S.format("lstm"), "rnn": S.format("rnn"), "leaky": S.format("leaky"),
    "lif": S.format("lif"), "alif": S.format("alif"),
    "rotation+rls": '[model]\nstack = "rotation"\nn_hidden = 8\nprecision = 64\n[readout]\nkind = "rls"\n',
    "reservoir+rls": RES,
    "reservoir+rls+change_lam": RES.replace('kind = "rls"\n', 'kind = "rls"\nchange_lam = 0.99\n'),
    "reservoir+learned lstm": RES + '[learned]\nstack = "lstm"\nn_hidden = 4\n',
    "transforms": S.format("gru") + '[transform]\nnormalise = true\nresidual = true\n',
    "feedback (supervised)": '[model]\nstack = "gru"\nn_hidden = 8\n[learning]\nmode = "supervised"\n'
                             '[transform]\nfeedback = 2\n',
    "screen clip": S.format("gru") + '[screen]\npolicy = "clip"\n',
    "experts": S.format("gru") + '[combine]\nexperts = true\n',
    "experts period": S.format("gru") + '[combine]\nexperts = true\nperiod = 24\n',
    "experts max_period": S.format("gru") + '[combine]\nexperts = true\nmax_period = 48\n',
    "es-d-rtrl": S.format("gru") + '[learning]\nalgorithm = "es-d-rtrl"\n',
    "rtrl": '[model]\nstack = "gru"\nn_hidden = 4\n[learning]\nalgorithm = "rtrl"\n',
    "horizon 3": S.format("gru") + '[learning]\nhorizon = 3\n',
    "rmsprop clip": S.format("gru") + '[learning]\noptimizer = "rmsprop"\nclip = 1.0\n',
    "label_delay": '[model]\nstack = "gru"\nn_hidden = 4\n[learning]\nmode = "supervised"\nlabel_delay = 3\n',
}
STEPS = 150
# relative, the largest over the steps: float32 models within their rounding; float64 under an
# RLS readout started at P = I / 1e-8, which amplifies the two compilers' last-bit differences
# (measured here 3.1e-8 to 1.1e-7; docs/devices.md); the default (float32 normaliser): F32
F32, F64 = 2e-4, 1e-6


@pytest.mark.slow          # one export each (5-25 s) and 150 steps of both
@pytest.mark.parametrize("name", list(CATALOGUE))
def test_every_learner_serve_runs_exports_and_predicts_as_jax(name, tmp_path):
    config = None
    if CATALOGUE[name] is not None:
        config = tmp_path / "c.toml"
        config.write_text(CATALOGUE[name])
    cfg, learner = learner_from_config(config)
    export_learner(config, tmp_path / "out")
    runner = Runner(tmp_path / "out")
    xs = mackey_glass(STEPS + 1)
    supervised = cfg.learning.mode == "supervised"
    ref, got = [], []
    for t in range(STEPS):
        x = np.full((1,) + learner.x_shape, xs[t], learner.x_dtype)
        y = np.full((1,) + learner.out_shape, xs[t + 1], learner.y_dtype) if supervised and not learner.label_delay else None
        ref.append(np.asarray(learner.step(x, y).prediction).ravel())
        got.append(runner.step(x, y)[0].ravel())
        if learner.label_delay and t:
            label = np.full(learner.out_shape, xs[t], learner.y_dtype)
            assert runner.label(label, 1)[0] == 0
            learner.label(label, age=1, slot=0)
    ref, got = np.array(ref), np.array(got)
    assert np.isfinite(got).all() and np.abs(ref).max() > 1e-3
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-3)
    assert rel.max() < (F64 if cfg.model.precision == 64 and name != "default" else F32), rel.max()


def test_a_part_iree_cannot_compile_is_refused_in_one_line():
    """A program IREE's CPU backend refuses (a scatter with batch dimensions, as ``vmap``
    writes an indexed update): one line naming the program, where (outside the package: a
    user's model, ``model.factory``) and IREE's reason."""
    put = jax.vmap(lambda r, i, v: jax.lax.dynamic_update_index_in_dim(r, v, i, 0))
    program = export_program("step", put, (jax.numpy.zeros((2, 4, 3)), jax.numpy.zeros(2, "int32"),
                                           jax.numpy.zeros((2, 3))))
    with pytest.raises(ExportError) as e:
        compile_program(program.text, "host", "step")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("IREE cannot compile the step program for host: model.factory")
    assert "test_export_catalogue.py:" in msg and "scatter" in msg
