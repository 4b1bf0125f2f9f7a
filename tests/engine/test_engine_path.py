"""Issue 9, engine path: the per-message shortcuts answer exactly as the general code does,
a slot no stream has used skips its reset (and one restored from a checkpoint does not),
memory given back after warm-up changes no answer, and brainstate loads without matplotlib."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from engine_helpers import answers

from streamtrace import wire
from streamtrace.engine import load_config
from streamtrace.recipe.build import build_learner
from streamtrace.engine.core import EngineCore
from streamtrace.engine.memory import release_after_warmup, rss_mb

N_IN = 2


def config(**engine):
    return load_config(None, {"model": {"stack": "gru", "n_in": N_IN, "n_hidden": 4, "n_out": N_IN},
                              "learning": {"mode": "forecast", "lr": 1e-2},
                              "engine": {"slots": 2, "park_s": 0.0, **engine},
                              "publish": {"weights_every": 0}})


def data(stream, seq, x, **fields):
    return wire.encode({"type": "data", "stream": stream, "seq": seq, "x": wire.pack_array(x), **fields})


# ---- the reply encoder and the data checks ------------------------------------------------------
@pytest.mark.parametrize("pred", [np.float32([1.5]), np.arange(6.0).reshape(2, 3), np.float32([1, 2, 3]).astype(">f4"),
                                  np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1], np.zeros((0,), np.float32)])
def test_prediction_encoder_gives_the_bytes_of_the_general_encoder(pred):
    enc = wire.PredictionEncoder()
    for loss in (0.25, None):
        want = wire.encode({"type": "prediction", "stream": "s", "seq": 7, "pred": wire.pack_array(pred),
                            "loss": loss, "step": 3, "version": 2, "ts": 1.5})
        assert enc("s", 7, pred, loss, 3, 2, 1.5) == want
    other = np.float64([1.0, 2.0])                        # a new dtype and shape: packed anew
    assert wire.unpack_array(wire.decode(enc("s", 8, other, None, 4, 2, 0.0))["pred"]).tolist() == [1.0, 2.0]


def test_data_checks_in_the_model_dtype_still_refuse_what_they_must():
    f4 = np.dtype(np.float32)
    ok = wire.decode_data(wire.decode(data("s", 0, np.float32([1, 2]), ts=None, mode=None)), (2,), (2,), f4, f4)
    assert ok["x"].tolist() == [1.0, 2.0] and ok["x"].dtype == f4 and ok["mode"] == "learn" and ok["ts"] == 0.0
    for bad in (np.float32([np.nan, 1]), np.float32([1, np.inf]), np.float64([1e300, 0])):   # f8 beyond f4: inf
        with pytest.raises(wire.WireError) as e:
            wire.decode_data(wire.decode(data("s", 0, bad)), (2,), (2,), f4, f4)
        assert e.value.code == "not_finite"
    big = np.full(40, np.nan, np.float32)                 # past the small-array loop: numpy checks it
    with pytest.raises(wire.WireError, match="NaN"):
        wire.decode_data(wire.decode(data("s", 0, big)), (40,), (2,), f4, f4)
    with pytest.raises(wire.WireError) as e:
        wire.decode_data(wire.decode(data("s", 0, np.float32([1, 2]), extra=1)), (2,), (2,), f4, f4)
    assert e.value.code == "unknown_field" and "extra" in str(e.value)


# ---- slots that need no reset ---------------------------------------------------------------------
def test_an_unused_slot_skips_its_reset_and_a_reused_one_is_reset():
    now = [0.0]
    core = EngineCore(config(slots=1, idle_timeout_s=1.0), clock=lambda: now[0])
    calls = []
    reset = core.learner.reset_slot
    core.learner.reset_slot = lambda slot: (calls.append(slot), reset(slot))
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(4, N_IN)).astype(np.float32)
    first = answers(core, [data("a", t, x) for t, x in enumerate(xs)])
    assert calls == []                                    # slot 0 was never used: its state is the initial one
    now[0] = 5.0
    core.evict_idle()                                     # "a" leaves; "b" takes slot 0
    again = answers(core, [data("b", t, x) for t, x in enumerate(xs)])
    assert calls == [0]
    # the oracle: a fresh learner of the same config, one step per sample
    ref = build_learner(core.cfg, slots=1, shared_weights=False)
    want = [ref.step(x[None]).prediction[0] for x in xs]
    for got in (first, again):
        np.testing.assert_allclose([wire.unpack_array(r["pred"]) for r in got], want, rtol=1e-6, atol=1e-7)


def test_after_a_resume_a_new_stream_gets_a_fresh_slot(tmp_path):
    now = [0.0]
    cfg = config(slots=2, idle_timeout_s=1.0)
    cfg.checkpoint.dir = str(tmp_path / "ck")
    core = EngineCore(cfg, clock=lambda: now[0])
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(5, N_IN)).astype(np.float32)
    answers(core, [data("a", t, x) for t, x in enumerate(xs)])   # slot 0 learns from "a"
    now[0] = 5.0
    core.evict_idle()                                     # slot 0 freed with "a"'s state still in it
    core.save_checkpoint()
    back = EngineCore(cfg, clock=lambda: now[0])
    assert back.resume() is not None
    got = answers(back, [data("b", t, x) for t, x in enumerate(xs[:3])])
    ref = build_learner(cfg, slots=2, shared_weights=False)
    want = [ref.step(np.stack([x, x]), active=np.array([True, False])).prediction[0] for x in xs[:3]]
    assert back.streams["b"].slot == 0
    np.testing.assert_allclose([wire.unpack_array(r["pred"]) for r in got], want, rtol=1e-6, atol=1e-7)


# ---- memory given back after warm-up ----------------------------------------------------------------
def test_releasing_memory_after_warmup_changes_no_answer(tmp_path):
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(8, N_IN)).astype(np.float32)
    msgs = [data("a", t, x) for t, x in enumerate(xs)]
    plain, released = EngineCore(config()), EngineCore(config())
    for core in (plain, released):
        core.warmup()
    want = answers(plain, msgs)
    got = answers(released, msgs[:4])
    release_after_warmup()
    got += answers(released, msgs[4:])
    assert [r["pred"] for r in got] == [r["pred"] for r in want]
    assert [r["loss"] for r in got] == [r["loss"] for r in want]
    # what needs eager jax after the release still works: a weights snapshot, a checkpoint
    released.cfg.checkpoint.dir = str(tmp_path / "ck")
    from streamtrace.learner.checkpoint import CheckpointDir
    released.ckpt = CheckpointDir(released.cfg.checkpoint.dir, 2)
    assert released.save_checkpoint() is not None
    snap = wire.decode(released.weights_message("snapshot"))
    assert snap["params"] and all(np.isfinite(wire.unpack_array(a)).all() for a in snap["params"].values())


def test_rss_reads_this_process():
    assert rss_mb() > 10 and rss_mb(999_999_999) is None


# ---- imports ----------------------------------------------------------------------------------------
def test_streamtrace_imports_brainstate_without_matplotlib_which_stays_importable():
    code = ("import sys, streamtrace\n"
            "from streamtrace import OnlineLearner\n"
            "import brainstate, saiunit\n"
            "assert 'brainstate' in sys.modules and 'matplotlib' not in sys.modules, 'matplotlib loaded'\n"
            "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
            "plt.figure(); plt.plot([1, 2]); print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_clients_and_bridges_import_without_jax():
    code = ("import sys, streamtrace.adapters, streamtrace.adapters.link, streamtrace.adapters.lsl, "
            "streamtrace.adapters.mqtt, streamtrace.wire, streamtrace.engine.config\n"
            "print(sorted(m for m in ('jax', 'brainstate', 'optax') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]
