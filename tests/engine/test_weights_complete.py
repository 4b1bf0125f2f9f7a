"""The weights a subscriber gets are everything that predicts: a learner given only the
engine's per-stream running state (hidden state, traces, counters) plus a ``weights`` snapshot
(``params``, ``state``) predicts exactly what the engine answers next; without the snapshot's
``state`` (readout, normaliser, experts) it does not. The snapshot also says which slot serves
which stream."""
from __future__ import annotations

import numpy as np
from engine_helpers import answers

from streamtrace import wire
from streamtrace.engine import load_config
from streamtrace.recipe.build import build_learner
from streamtrace.engine.core import EngineCore

SECTIONS = {"model": {"stack": "reservoir", "n_in": 2, "n_hidden": 20, "n_out": 1, "precision": 64},
            "learning": {"mode": "supervised", "optimizer": "frozen"},
            "learned": {"stack": "gru", "n_hidden": 4},
            "transform": {"normalise": True, "normalise_warmup": 5, "normalise_rate": 0.01},
            "readout": {"kind": "rls"}, "combine": {"experts": True},
            "engine": {"slots": 2, "park_s": 0.0}, "publish": {"weights_every": 0}}
PREDICTING = ("params.", "readout.", "signal.", "combine.")


def _msg(stream, seq, x, y):
    return wire.encode({"type": "data", "stream": stream, "seq": seq, "x": wire.pack_array(x),
                        "y": wire.pack_array(y)})




def _with_snapshot(fresh: dict, running: dict, snap: dict, use_state: bool) -> dict:
    """``fresh`` (a new learner's state), with the engine's running per-stream state and the
    snapshot's weights (and, if ``use_state``, its predicting state) in place."""
    out = {k: (v if k.startswith(PREDICTING) else running[k]) for k, v in fresh.items()}
    params = {n: wire.unpack_array(a) for n, a in snap["params"].items()}
    for key in out:
        if key.startswith("params."):
            hits = [p for p in params if key.endswith("." + p)]
            assert len(hits) == 1, (key, hits)
            out[key] = params[hits[0]]
    if use_state:
        for n, a in snap["state"].items():
            out[n] = wire.unpack_array(a)
    return out


def test_a_snapshot_carries_everything_that_predicts():
    cfg = load_config(None, SECTIONS)
    core = EngineCore(cfg)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(2, 61, 2))
    ys = np.sin(xs.sum(-1, keepdims=True))
    names = ["s-a", "s-b"]
    answers(core, [_msg(n, t, xs[i, t], ys[i, t]) for t in range(60) for i, n in enumerate(names)])
    snap = wire.decode(core.weights_message("snapshot"))
    assert {"readout.W", "readout.err", "signal.x.mean", "combine.L"} <= set(snap["state"])
    assert "readout.P" not in snap["state"]
    assert sorted(snap["streams"]) == names and sorted(snap["streams"].values()) == [0, 1]
    running = core.learner.state_dict()
    last = answers(core, [_msg(n, 60, xs[i, 60], ys[i, 60]) for i, n in enumerate(names)])
    want = np.array([wire.unpack_array(r["pred"]) for r in last])

    def predicted(use_state):
        mirror = build_learner(cfg, slots=2, shared_weights=False)
        mirror.load_state_dict(_with_snapshot(mirror.state_dict(), running, snap, use_state))
        slots = [snap["streams"][n] for n in names]
        x, y = np.zeros((2, 2)), np.zeros((2, 1))
        x[slots], y[slots] = xs[:, 60], ys[:, 60]
        return np.asarray(mirror.step(x, y).prediction)[slots]
    np.testing.assert_allclose(predicted(True), want, rtol=1e-9, atol=1e-12)
    assert not np.allclose(predicted(False), want, rtol=1e-6), "the predicting state made no difference"


def test_an_update_carries_the_predicting_state_that_moved():
    core = EngineCore(load_config(None, SECTIONS))
    x, y = np.ones(2), np.ones(1)
    answers(core, [_msg("s", t, x * t, y * t) for t in range(10)])
    core.weights_message("snapshot")
    answers(core, [_msg("s", t, x * t, y * t) for t in range(10, 15)])
    upd = wire.decode(core.weights_message("update"))
    assert upd["kind"] == "update" and "readout.W" in upd["state"] and upd["streams"] == {"s": 0}
    assert "signal.x.mean" in upd["state"]
