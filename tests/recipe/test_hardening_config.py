"""Issue 8, items 3 and 4: every bad config ends in one ``config error: <section.key>: ...``
line and exit code 2 from ``streamtrace serve``, blamed on the right key; CURVE fails closed.

Most cases run in-process through ``load_config`` + ``open_engine``, the code ``serve`` runs
before listening; a handful go through the real CLI in a subprocess (one jax import each).
"""
from paths import TESTS
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth

from streamtrace.transport import SensorClient
from streamtrace.engine.launch import write_config
from streamtrace.engine import ConfigError, load_config
from streamtrace.recipe.build import build_learner
from streamtrace.engine.server import open_engine
from streamtrace.learner import CheckpointDir

TESTS_DIR = TESTS
REPO = TESTS_DIR.parent


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def busy_port():
    """A TCP port on loopback that something else is listening on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module of broken model factories, importable as ``badfactories``."""
    (tmp_path / "badfactories.py").write_text(
        "import streamtrace as st\n"
        "NOT_CALLABLE = 3\n"
        "def raises():\n    raise RuntimeError('no GPU here')\n"
        "def not_a_module():\n    return 42\n"
        "def lif_3_in():\n    return st.nn.Stack('lif', 3, 4, 3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "badfactories"


@pytest.fixture
def keys(tmp_path):
    """A CURVE server key pair, one authorised client, one stranger, an authorised folder."""
    k, allowed = tmp_path / "keys", tmp_path / "allowed"
    k.mkdir()
    allowed.mkdir()
    paths = {}
    for name in ("server", "client", "stranger"):
        paths[name + "_public"], paths[name + "_secret"] = map(Path, zmq.auth.create_certificates(k, name))
    (allowed / "client.key").write_bytes((k / "client.key").read_bytes())
    paths["allowed"] = allowed
    paths["empty"] = tmp_path / "empty"
    paths["empty"].mkdir()
    return paths


_SOCKETS = {"dir": "/tmp"}
_names = itertools.count()


@pytest.fixture(autouse=True)
def short_socket_dir():
    """ipc:// paths must stay under ~100 characters: pytest's tmp_path can be longer."""
    _SOCKETS["dir"] = tempfile.mkdtemp(prefix="sth-", dir="/tmp")
    yield
    shutil.rmtree(_SOCKETS["dir"], ignore_errors=True)


def _sections(tmp_path, **over):
    router = f"ipc://{_SOCKETS['dir']}/r{next(_names)}"
    sections = {"model": {"stack": "gru", "n_hidden": 4}, "engine": {"slots": 2, "micro_batch": 1},
                "sockets": {"router": router, "pull": "", "pub": ""}}
    for section, values in over.items():
        sections.setdefault(section, {}).update(values)
    return sections


def _config_error(path) -> ConfigError:
    """What ``streamtrace serve --config path`` fails with before listening (in-process)."""
    try:
        engine = open_engine(load_config(path))
    except ConfigError as e:
        return e
    engine.close()
    pytest.fail(f"{path} was accepted")


# (section, values, blamed key, a fragment of the message)
BAD = [
    ("learning", {"clip": -1.0}, "learning.clip", "> 0"),
    ("learning", {"clip": float("nan")}, "learning.clip", "nan"),
    ("learning", {"lr": float("inf")}, "learning.lr", "finite"),
    ("learning", {"lr": 0.0}, "learning.lr", "> 0"),
    ("learning", {"learn_every": 0}, "learning.learn_every", "got 0"),
    ("learning", {"algorithm": "es-d-rtrl", "decay": 5.0}, "learning.decay", "[0, 1)"),
    ("learning", {"algorithm": "es-d-rtrl", "decay": -0.1}, "learning.decay", "[0, 1)"),
    ("learning", {"decay": 0.5}, "learning.decay", "only es-d-rtrl"),
    ("learning", {"algorithm": "es-d-rtrl", "rank": 0.5}, "learning.rank", ">= 1"),
    ("learning", {"algorithm": "es-d-rtrl", "rank": 3.0, "decay": 0.5}, "learning.rank", "not both"),
    ("learning", {"lr": "fast"}, "learning.lr", "must be a number"),
    ("model", {"n_out": 2}, "model.n_out", "forecast mode"),
    ("model", {"readout": "conv"}, "model.readout", "'conv'"),
    ("model", {"seed": -1}, "model.seed", "got -1"),
    ("model", {"n_hidden": 10**12}, "model.n_hidden", "1..1000000"),
    ("model", {"factory": "no_such_module_xyz:make"}, "model.factory", "no_such_module_xyz"),
    ("model", {"factory": "json:no_such_attribute"}, "model.factory", "no attribute 'no_such_attribute'"),
    ("model", {"factory": "badfactories:NOT_CALLABLE"}, "model.factory", "not a function"),
    ("model", {"factory": "badfactories:raises"}, "model.factory", "RuntimeError: no GPU here"),
    ("model", {"factory": "badfactories:not_a_module"}, "model.factory", "not a brainstate.nn.Module"),
    ("model", {"factory": "badfactories:lif_3_in"}, "model.n_in", "model.n_in = 1"),
    ("model", {"factory": "not a factory"}, "model.factory", "package.module:function"),
    ("engine", {"idle_timeout_s": -5.0}, "engine.idle_timeout_s", ">= 0"),
    ("engine", {"idle_timeout_s": float("nan")}, "engine.idle_timeout_s", ">= 0"),
    ("engine", {"max_message_bytes": 0}, "engine.max_message_bytes", "got 0"),
    ("engine", {"max_message_bytes": 100}, "engine.max_message_bytes", "got 100"),
    ("engine", {"cpu": 4096}, "engine.cpu", "CPU 4096 is not available"),
    ("engine", {"cpu": -2}, "engine.cpu", "got -2"),
    ("engine", {"slots": 0}, "engine.slots", "got 0"),
    ("engine", {"micro_batch": 0}, "engine.micro_batch", "got 0"),
    ("engine", {"busy_poll_us": -1}, "engine.busy_poll_us", "got -1"),
    ("engine", {"busy_poll_us": 0.5}, "engine.busy_poll_us", "must be an integer"),
    ("engine", {"slots": "4"}, "engine.slots", "must be an integer"),
    ("engine", {"slots": 2.5}, "engine.slots", "must be an integer"),
    ("engine", {"shared_weights": 1}, "engine.shared_weights", "true or false"),
    ("engine", {"on_gap": "ignore"}, "engine.on_gap", "'ignore'"),
    ("engine", {"slotz": 4}, "engine.slotz", "unknown key"),
    ("publish", {"stats_every_s": 0.0}, "publish.stats_every_s", "> 0"),
    ("publish", {"stats_every_s": True}, "publish.stats_every_s", "must be a number"),
    ("publish", {"weights_every": -1}, "publish.weights_every", "got -1"),
    ("checkpoint", {"keep": 0}, "checkpoint.keep", "got 0"),
    ("checkpoint", {"every": 0}, "checkpoint.every", "got 0"),
    ("sockets", {"router": "garbage"}, "sockets.router", "not a ZeroMQ address"),
    ("sockets", {"router": "tcp://127.0.0.1"}, "sockets.router", "tcp address"),
    ("sockets", {"router": "tcp://127.0.0.1:70000"}, "sockets.router", "tcp address"),
    ("sockets", {"router": "tcp://no.such.host.invalid:5555"}, "sockets.router", "cannot listen"),
    ("sockets", {"router": "ipc:///no/such/folder/r"}, "sockets.router", "cannot listen"),
    ("sockets", {"router": ""}, "sockets.router", "required"),
    ("sockets", {"hwm": -1}, "sockets.hwm", "got -1"),
    ("metrics", {"prometheus_port": 70000}, "metrics.prometheus_port", "0..65535"),
    ("metrics", {"prometheus_port": -1}, "metrics.prometheus_port", "0..65535"),
    ("security", {"curve_secret_key_file": "/no/such/server.key_secret", "curve_authorized_dir": "/tmp"},
     "security.curve_secret_key_file", "does not exist"),
    ("security", {"curve_authorized_dir": "/tmp"}, "security.curve_authorized_dir", "no effect without"),
    ("security", {"allow_any_client": True}, "security.allow_any_client", "no effect without"),
    ("security", {"curve_secret_key_file": "/k", "curve_authorized_dir": "/tmp", "allow_any_client": True},
     "security.allow_any_client", "contradicts"),
    ("modle", {"n_in": 1}, "modle", "unknown section"),
]


@pytest.mark.parametrize("section,values,key,fragment", BAD, ids=[f"{b[2]}={list(b[1].values())[-1]!r}" for b in BAD])
def test_bad_value_is_one_config_error_naming_its_key(tmp_path, factories, section, values, key, fragment):
    path = write_config(tmp_path / "c.toml", _sections(tmp_path, **{section: values}))
    e = _config_error(path)
    assert e.key == key and str(e).startswith(key + ": "), str(e)
    assert fragment in str(e), str(e)


def test_ports_in_use_are_named(tmp_path, busy_port):
    e = _config_error(write_config(tmp_path / "a.toml", _sections(
        tmp_path, sockets={"router": f"tcp://127.0.0.1:{busy_port}"})))
    assert e.key == "sockets.router" and "in use" in str(e), str(e)
    e = _config_error(write_config(tmp_path / "b.toml", _sections(tmp_path, metrics={"prometheus_port": busy_port})))
    assert e.key == "metrics.prometheus_port" and "in use" in str(e), str(e)
    same = f"tcp://127.0.0.1:{_free_port()}"          # two keys naming one endpoint
    e = _config_error(write_config(tmp_path / "c.toml", _sections(tmp_path, sockets={"router": same, "pub": same})))
    assert e.key == "sockets.pub" and "also sockets.router" in str(e), str(e)


def test_unusable_files_and_folders_are_named(tmp_path, keys):
    (tmp_path / "afile").write_text("x")
    e = _config_error(write_config(tmp_path / "a.toml", _sections(tmp_path, checkpoint={"dir": str(tmp_path / "afile")})))
    assert e.key == "checkpoint.dir" and "not a folder" in str(e), str(e)
    for name, text in (("garbage.key_secret", "not a certificate\n"),
                       ("public-only.key", keys["server_public"].read_text())):
        (tmp_path / name).write_text(text)
        e = _config_error(write_config(tmp_path / "b.toml", _sections(tmp_path, security={
            "curve_secret_key_file": str(tmp_path / name), "curve_authorized_dir": str(keys["allowed"])})))
        assert e.key == "security.curve_secret_key_file", str(e)
    (tmp_path / "c.toml").write_bytes(b"[model]\nstack = '\xff'\n")
    assert _config_error(tmp_path / "c.toml").key == "--config"


# ---- checkpoints of another model --------------------------------------------------------------
def _checkpoint_dir_of(tmp_path, **learning):
    """A checkpoint folder written by the learner an engine config with ``learning`` builds."""
    folder = tmp_path / "ckpt"
    cfg = load_config(None, _sections(tmp_path, checkpoint={"dir": str(folder)},
                                      learning={"algorithm": "es-d-rtrl", **learning}))
    learner = build_learner(cfg, slots=cfg.engine.slots, shared_weights=cfg.engine.shared_weights)
    CheckpointDir(folder).save(7, learner.state_dict(), learner.signature(), {"steps": 7})
    return folder


def test_checkpoint_folder_of_another_model_refuses_to_start_and_is_left_alone(tmp_path):
    folder = _checkpoint_dir_of(tmp_path, decay=0.9)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    path = write_config(tmp_path / "c.toml", _sections(tmp_path, checkpoint={"dir": str(folder)},
                                                       learning={"algorithm": "es-d-rtrl", "decay": 0.5}))
    e = _config_error(path)
    assert e.key == "checkpoint.dir" and "decay: expected 0.5, checkpoint has 0.9" in str(e), str(e)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before   # not overwritten


def test_other_learning_rate_resumes_with_a_warning(tmp_path):
    folder = _checkpoint_dir_of(tmp_path, decay=0.9, lr=1e-3)
    cfg = load_config(None, _sections(tmp_path, checkpoint={"dir": str(folder)},
                                      learning={"algorithm": "es-d-rtrl", "decay": 0.9, "lr": 1e-2}))
    engine = open_engine(cfg)
    try:
        assert engine.resumed is not None and engine.core.steps == 7
        (warning,) = engine.resumed["warnings"]
        assert "optimizer." in warning and "step_size: expected -0.01, checkpoint has -0.001" in warning
    finally:
        engine.close()


# ---- CURVE fails closed --------------------------------------------------------------------------
def _running(cfg):
    engine = open_engine(cfg)
    th = threading.Thread(target=engine.run, kwargs={"install_signals": False, "max_seconds": 60}, daemon=True)
    th.start()
    return engine, th


@pytest.mark.parametrize("where", ["missing", "empty", "unset"])
def test_curve_without_a_usable_authorized_folder_refuses_to_start(tmp_path, keys, where):
    folder = {"missing": str(tmp_path / "nope"), "empty": str(keys["empty"]), "unset": ""}[where]
    sections = _sections(tmp_path, security={"curve_secret_key_file": str(keys["server_secret"]),
                                             "curve_authorized_dir": folder})
    e = _config_error(write_config(tmp_path / "c.toml", sections))
    assert e.key == "security.curve_authorized_dir", str(e)
    # an Engine built directly (not through serve) refuses as well
    from streamtrace.engine import Engine
    cfg = load_config(None, _sections(tmp_path))
    cfg.security.curve_secret_key_file, cfg.security.curve_authorized_dir = str(keys["server_secret"]), folder
    with pytest.raises(ConfigError, match="security.curve_authorized_dir"):
        Engine(cfg)


def _step_with(endpoint, server_key, client_secret, timeout_s):
    with SensorClient(endpoint, stream=f"s-{client_secret and Path(client_secret).stem}", timeout_s=timeout_s,
                      server_public_key=server_key,
                      client_keys=None if client_secret is None else str(client_secret)) as c:
        return c.step(np.zeros(1, np.float32))


def test_allow_any_client_admits_any_key_with_a_loud_warning(tmp_path, keys, caplog):
    """(Only authorised keys get in with an authorized folder: test_engine_security_metrics.)"""
    server_key, _ = zmq.auth.load_certificate(keys["server_public"])
    sec = {"curve_secret_key_file": str(keys["server_secret"])}
    caplog.set_level("WARNING", logger="streamtrace.engine")
    engine, th = _running(load_config(None, _sections(tmp_path, security={**sec, "allow_any_client": True})))
    try:
        ep = engine.endpoints["router"]
        assert any("ANY client key" in r.getMessage() for r in caplog.records)
        for who in ("client_secret", "stranger_secret"):
            assert _step_with(ep, server_key, keys[who], 20)["type"] == "prediction"
        with SensorClient(ep, stream="plain", timeout_s=1.5) as c:    # no CURVE at all: still refused
            with pytest.raises(TimeoutError):
                c.step(np.zeros(1, np.float32))
    finally:
        engine.stop()
        th.join(10)
    assert engine.core.metrics.counters["accepted"] == 2


# ---- the real CLI ------------------------------------------------------------------------------
def test_cli_prints_one_config_error_line_and_exits_2(tmp_path, keys, busy_port):
    """A few bad configs through ``python -m streamtrace serve``, run side by side: one caught
    by validation, one by the machine checks, one by CURVE's, one only once the learner exists."""
    cases = {
        "learning.clip": {"learning": {"clip": -1.0}},
        "sockets.router": {"sockets": {"router": f"tcp://127.0.0.1:{busy_port}"}},
        "security.curve_authorized_dir": {"security": {"curve_secret_key_file": str(keys["server_secret"]),
                                                       "curve_authorized_dir": str(tmp_path / "nope")}},
        "checkpoint.dir": {"checkpoint": {"dir": str(_checkpoint_dir_of(tmp_path, decay=0.9))},
                           "learning": {"algorithm": "es-d-rtrl", "decay": 0.5}},
    }
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]))
    procs = {}
    for key, over in cases.items():
        path = write_config(tmp_path / f"{key}.toml", _sections(tmp_path, **over))
        procs[key] = subprocess.Popen([sys.executable, "-m", "streamtrace", "serve", "--config", str(path)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for key, proc in procs.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 2, (key, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"config error: {key}: "), (key, err)
        assert "Traceback" not in out + err and "streamtrace engine:" not in out
