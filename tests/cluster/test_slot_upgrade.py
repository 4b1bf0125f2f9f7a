"""A worker resumes a partition checkpoint whose experts' mixture is of another kind (an older
release's default) with every stream's other state as saved, by path, and the mixture fresh;
a checkpoint of another model is still refused (streamtrace/cluster/slot_upgrade.py). No NATS:
the worker's ``Stepper`` alone."""
import logging

import jax
import numpy as np
import pytest

from streamtrace import wire
from streamtrace.cluster.stepper import Stepper
from streamtrace.engine import load_config
from streamtrace.learner.checkpoint import CheckpointError


def stepper(combine, n_hidden=5):
    return Stepper(load_config(None, {"model": {"stack": "gru", "n_in": 1, "n_hidden": n_hidden, "n_out": 1},
                                      "learning": {"mode": "forecast"}, "combine": {"experts": True, **combine},
                                      "engine": {"slots": 2, "shared_weights": False}}))


def by_path(s, name):
    leaves = jax.tree_util.tree_flatten_with_path(s.core.learner.read_slot(s.streams()[name].slot))[0]
    return {jax.tree_util.keystr(p): np.asarray(a) for p, a in leaves}


def test_another_mixture_resumes_all_but_the_mixture(caplog):
    old = stepper({"max_period": 0})
    xs = np.sin(0.4 * np.arange(30))
    for t in range(30):
        kind, _ = old.step(wire.data_message("a", t, np.array([xs[t]], np.float32)), "a")
        assert kind == "pred"
    raw = old.snapshot(["a"], 30, {})
    saved = by_path(old, "a")
    new = stepper({"max_period": 12})
    fresh = {jax.tree_util.keystr(p): np.asarray(a)
             for p, a in jax.tree_util.tree_flatten_with_path(new.core.learner.read_slot(0))[0]}
    assert [e[0] for e in new.signature["slot_state"]] != [e[0] for e in old.signature["slot_state"]] or \
        new.signature["combine"] != old.signature["combine"]
    with caplog.at_level(logging.WARNING, logger="streamtrace.cluster"):
        seq, names = new.restore(raw, "checkpoint p0")
    assert (seq, names) == (30, ["a"]) and new.streams()["a"].next_seq == 30
    assert any("mixture" in r.getMessage() for r in caplog.records)
    got = by_path(new, "a")
    mix = [k for k in got if k.startswith("['combine']")]
    rest = [k for k in got if k not in mix]
    assert mix and rest
    assert all(np.array_equal(got[k], saved[k]) for k in rest)                  # as saved, by path
    assert all(np.array_equal(got[k], fresh[k]) for k in mix)                   # afresh
    assert any(not np.array_equal(saved[k], fresh[k]) for k in rest)            # the test can see a change
    kind, _ = new.step(wire.data_message("a", 30, np.array([xs[0]], np.float32)), "a")
    assert kind == "pred"                                                       # and it steps on


def test_another_model_is_still_refused():
    old = stepper({"max_period": 0})
    old.step(wire.data_message("a", 0, np.array([0.5], np.float32)), "a")
    raw = old.snapshot(["a"], 1, {})
    other = stepper({"max_period": 12}, n_hidden=4)
    with pytest.raises(CheckpointError, match="different model"):
        other.restore(raw, "checkpoint p0")
    assert not other.streams()
