"""Config keys of the learning-quality parts: bad values name their key, good ones reach the learner."""
import numpy as np
import pytest

from streamtrace.recipe.build import build_learner
from streamtrace.engine.config import ConfigError, load_config

BAD = [
    ({"reservoir": {"leak": 0.0}}, "reservoir.leak"),
    ({"reservoir": {"density": 1.5}}, "reservoir.density"),
    ({"reservoir": {"spectral_radius": -1.0}}, "reservoir.spectral_radius"),
    ({"transform": {"normalise_warmup": 0}}, "transform.normalise_warmup"),
    ({"transform": {"normalise_rate": 1.0}}, "transform.normalise_rate"),
    ({"transform": {"residual": True}, "learning": {"mode": "supervised"}}, "transform.residual"),
    ({"readout": {"kind": "ridge"}}, "readout.kind"),
    ({"readout": {"kind": "rls", "lam": 0.0}}, "readout.lam"),
    ({"readout": {"kind": "rls", "delta": [0.1, -1.0]}}, "readout.delta"),
    ({"readout": {"kind": "rls", "delta": []}}, "readout.delta"),
    ({"model": {"stack": "reservoir"}}, "readout.kind"),
    ({"model": {"precision": 16}}, "model.precision"),
    ({"model": {"n_in": 2, "n_out": 1}, "learning": {"channels": [2]}}, "learning.channels"),
    ({"model": {"n_in": 2, "n_out": 2}, "learning": {"channels": [0, 0]}}, "learning.channels"),
    ({"learning": {"horizon": 0}}, "learning.horizon"),
    ({"learning": {"optimizer": "frozn"}}, "learning.optimizer"),
    ({"metrics": {"window": 0}}, "metrics.window"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=[k for _, k in BAD])
def test_bad_quality_values_name_their_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides=overrides)
    assert e.value.key == key, str(e.value)


def test_a_full_quality_config_reaches_the_learner():
    cfg = load_config(None, overrides={
        "model": {"stack": "reservoir", "n_in": 2, "n_hidden": 12, "n_out": 1, "precision": 64},
        "reservoir": {"leak": 0.5, "spectral_radius": 0.8},
        "transform": {"normalise": True, "normalise_warmup": 5, "residual": True},
        "readout": {"kind": "rls", "delta": 1e-3, "lam": 0.999},
        "learning": {"optimizer": "frozen", "channels": [1], "horizon": 3},
        "metrics": {"window": 50}})
    learner = build_learner(cfg)
    assert learner.x_dtype == np.float64 and learner.out_shape == (1,) and learner.horizon == 3
    assert learner.model.leak == 0.5
    sig = learner.signature()
    assert sig["readout"]["delta"] == [1e-3] and sig["readout"]["lam"] == 0.999
    assert [p["kind"] for p in sig["transform"]["parts"]] == ["normalise", "residual"]
    assert sig["frozen"] and sig["channels"] == [1] and sig["window"] == 50
    rng = np.random.default_rng(0)
    before = learner.params
    for _ in range(8):
        r = learner.step(rng.normal(size=2))
    assert r.prediction.shape == (3, 1)
    # frozen: the reservoir never moves; the readout learned after the 5-sample warm-up
    for k, v in learner.params.items():
        np.testing.assert_array_equal(v, before[k])
    assert np.any(learner.state_dict()["readout.W"] != 0)


def test_the_old_signal_section_is_read_as_transform_with_a_warning():
    new = load_config(None, overrides={"transform": {"normalise": True, "normalise_warmup": 7}})
    with pytest.warns(FutureWarning, match=r"\[signal\] is now called \[transform\]"):
        old = load_config(None, overrides={"signal": {"normalise": True, "normalise_warmup": 7}})
    assert old.transform == new.transform and old.transform.normalise_warmup == 7
    with pytest.raises(ConfigError, match="give one of them"):
        load_config(None, overrides={"signal": {"normalise": True}, "transform": {"normalise": True}})
