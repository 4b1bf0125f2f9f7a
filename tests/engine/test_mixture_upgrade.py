"""An engine resumes a checkpoint whose experts' mixture is of another kind (an older release's
default, before season detection was on) with everything else as saved and the mixture fresh,
and says so; a checkpoint of another model is still refused."""
import numpy as np
import pytest

from streamtrace import wire
from streamtrace.engine import load_config
from streamtrace.engine.core import EngineCore
from streamtrace.learner.checkpoint import CheckpointError

from engine_helpers import answers


def config(tmp_path, combine, n_hidden=6):
    return load_config(None, {"model": {"stack": "gru", "n_in": 1, "n_hidden": n_hidden, "n_out": 1},
                              "learning": {"mode": "forecast"}, "combine": {"experts": True, **combine},
                              "engine": {"slots": 2}, "publish": {"weights_every": 0},
                              "checkpoint": {"dir": str(tmp_path), "every": 10_000}})


def feed(core, n=30):
    xs = np.sin(0.4 * np.arange(n, dtype=np.float32))[:, None]
    return answers(core, [wire.data_message("a", t, xs[t]) for t in range(n)])


def test_another_mixture_resumes_all_but_the_mixture(tmp_path):
    old = EngineCore(config(tmp_path, {"max_period": 0}))
    feed(old)
    old.save_checkpoint()
    saved = old.learner.state_dict()
    new = EngineCore(config(tmp_path, {"max_period": 12}))
    fresh = new.learner.state_dict()
    resumed = new.resume()
    assert resumed is not None and any("mixture" in w for w in resumed["warnings"])
    got = new.learner.state_dict()
    rest = [k for k in got if not k.startswith("combine.")]
    assert rest and all(np.array_equal(got[k], saved[k]) for k in rest)           # as saved
    mix = [k for k in got if k.startswith("combine.")]
    assert mix and all(np.array_equal(got[k], fresh[k]) for k in mix)             # afresh
    assert any(not np.array_equal(saved[k], fresh[k]) for k in rest)              # the test can see a change
    assert new.steps == old.steps


def test_the_same_mixture_resumes_whole_and_another_model_is_refused(tmp_path):
    a = EngineCore(config(tmp_path, {"max_period": 12}))
    feed(a)
    a.save_checkpoint()
    b = EngineCore(config(tmp_path, {"max_period": 12}))
    assert not b.resume().get("warnings")
    want, got = a.learner.state_dict(), b.learner.state_dict()
    assert all(np.array_equal(want[k], got[k]) for k in want)
    with pytest.raises(CheckpointError, match="n_hidden|cell"):
        EngineCore(config(tmp_path, {"max_period": 0}, n_hidden=5)).resume()
