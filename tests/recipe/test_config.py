"""Engine configuration: defaults that work, and clear errors for bad values."""
import pytest

from streamtrace.engine import ConfigError, build_model, load_config


def test_defaults_are_valid_and_loopback_only():
    cfg = load_config()
    assert cfg.exposed_remotely() == []
    assert cfg.learning.algorithm == "d-rtrl" and cfg.engine.slots >= 1
    model = build_model(cfg.model)
    assert model.kind == cfg.model.stack


def test_toml_file_and_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[model]\nstack = "alif"\nn_hidden = 12\n[learning]\nlr = 1\n[sockets]\nrouter = "tcp://0.0.0.0:7000"\n')
    cfg = load_config(p, {"engine": {"slots": 3}})
    assert (cfg.model.stack, cfg.model.n_hidden, cfg.learning.lr, cfg.engine.slots) == ("alif", 12, 1.0, 3)
    assert cfg.exposed_remotely() == ["tcp://0.0.0.0:7000"]


@pytest.mark.parametrize("text,match", [
    ("[model]\nstack = 'transformer'\n", "model.stack"),
    ("[model]\nn_hidden = 0\n", "model.n_hidden"),
    ("[model]\nn_hidden = 'big'\n", "model.n_hidden: must be an integer"),
    ("[learning]\nalgorithm = 'bptt'\n", "learning.algorithm"),
    ("[learning]\nmode = 'online'\n", "learning.mode"),
    ("[learning]\noptimizer = 'lbfgs'\n", "learning.optimizer"),
    ("[engine]\nslotz = 4\n", "engine.slotz: unknown key"),
    ("[engine]\non_gap = 'ignore'\n", "on_gap"),
    ("model = 3\n", "model: must be a table"),
    ("[model\n", "invalid TOML"),
])
def test_bad_config_is_named(tmp_path, text, match):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(p)


def test_missing_file_and_bad_factory(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    cfg = load_config(None, {"model": {"factory": "no_such_module:make"}})
    with pytest.raises(ConfigError, match="no_such_module"):
        build_model(cfg.model)
    with pytest.raises(ConfigError, match="model.factory: .*module:function"):
        load_config(None, {"model": {"factory": "just_a_name"}})


def test_user_factory_is_used():
    cfg = load_config(None, {"model": {"factory": "models:lif_net", "n_in": 3, "n_out": 2}})
    import models
    assert isinstance(build_model(cfg.model), models.Stack)


@pytest.mark.parametrize("sizes,match", [({"n_in": 3, "n_out": 5}, "n_out = 5"),
                                         ({"n_in": 4, "n_out": 2}, "n_in = 4")])
def test_model_sizes_are_checked_against_the_model_at_start(sizes, match):
    from streamtrace.engine import EngineCore
    cfg = load_config(None, {"model": {"factory": "models:lif_net", **sizes},
                             "learning": {"mode": "supervised"}, "engine": {"slots": 1}})
    with pytest.raises(ValueError, match=match):
        EngineCore(cfg)
