"""Step programs stored whole (engine/executables.py): a restart loads them without tracing,
and a loaded program computes the same bits as one compiled afresh."""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from streamtrace.engine import load_config
from streamtrace.recipe.build import build_learner
from streamtrace.engine.compile_cache import disable
from streamtrace.engine.executables import ExecutableStore, fingerprint
from streamtrace.engine.server import Engine
from streamtrace.learner.programs import Programs
from configs import ipc_sockets  # noqa: E402

SLOTS, K = 8, 2


@pytest.fixture(autouse=True)
def _no_cache_after():
    yield
    disable()


def config(**learning):
    return load_config(None, {"model": {"stack": "gru", "n_in": 2, "n_hidden": 3, "n_out": 2},
                              "learning": {"mode": "forecast", "lr": 1e-2, **learning},
                              "engine": {"slots": SLOTS, "micro_batch": K}, "publish": {"weights_every": 0}})


def learner(cfg, folder):
    L = build_learner(cfg, slots=SLOTS, shared_weights=False)
    L.programs.store = ExecutableStore.for_config(folder, cfg)
    return L


@pytest.fixture
def traces(monkeypatch):
    """How often the per-slot step is traced (a loaded program traces nothing)."""
    count = [0]
    original = Programs._each_model

    def counted(self, *a):
        count[0] += 1
        return original(self, *a)
    monkeypatch.setattr(Programs, "_each_model", counted)
    return count


def run(L, steps, seed=0):
    """``steps`` loop calls of random one-step inputs; the output vectors and final buffers."""
    rng = np.random.default_rng(seed)
    P = L.programs
    views = P.loop(K).inputs.views
    outs = []
    for _ in range(steps):
        views[1][...] = rng.normal(size=views[1].shape)
        views[3][...] = rng.random(views[3].shape) < 0.7      # which slots are busy
        views[4][...] = True
        L.buffers, out = P.run_loop(L.buffers, 1, *views[1:])
        outs.append(out)
    return np.stack(outs), [np.asarray(b) for b in L.buffers]


def test_a_second_learner_loads_the_program_traces_nothing_and_computes_the_same_bits(tmp_path, traces):
    cfg = config()
    first = learner(cfg, tmp_path)
    want, want_state = run(first, 12)
    assert first.programs.store.saved >= 1 and traces[0] > 0

    traces[0] = 0
    second = learner(cfg, tmp_path)
    got, got_state = run(second, 12)
    assert second.programs.store.loaded == 1 and second.programs.store.saved == 0
    assert traces[0] == 0, "the stored program was traced again"
    np.testing.assert_array_equal(got, want)
    for a, b in zip(got_state, want_state):
        np.testing.assert_array_equal(a, b)


def test_anything_compiled_into_the_program_changes_its_key(tmp_path):
    base = fingerprint(config())
    assert base == fingerprint(config())
    assert fingerprint(config(lr=2e-2)) != base            # a constant of the step
    assert fingerprint(config(algorithm="es-d-rtrl")) != base
    cfg = config()
    assert fingerprint(dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, micro_batch=4))) != base
    # a user's model factory is code the key cannot see: never stored
    factory = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, factory="pkg.mod:make"))
    assert fingerprint(factory) is None and ExecutableStore.for_config(tmp_path, factory) is None
    assert ExecutableStore.for_config(None, cfg) is None


def test_a_changed_config_compiles_its_own_program(tmp_path, traces):
    learner(config(), tmp_path).programs.loop(K)
    traces[0] = 0
    other = learner(config(lr=2e-2), tmp_path)
    other.programs.loop(K)
    assert other.programs.store.loaded == 0 and traces[0] > 0


def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path, caplog):
    cfg = config()
    want, _ = run(learner(cfg, tmp_path), 4)
    stored = list((tmp_path / "executables").glob("*.xla"))
    assert len(stored) == 1
    stored[0].write_bytes(b"not an executable")
    L = learner(cfg, tmp_path)
    got, _ = run(L, 4)
    np.testing.assert_array_equal(got, want)
    assert L.programs.store.loaded == 0 and L.programs.store.saved == 1
    assert "could not be loaded" in caplog.text
    third = learner(cfg, tmp_path)
    third.programs.loop(K)
    assert third.programs.store.loaded == 1         # the replaced entry loads


def test_a_restarted_engine_serves_its_first_call_with_the_stored_program(tmp_path):
    sock = Path(tempfile.mkdtemp(prefix="st-ex-", dir="/tmp"))
    try:
        cfg = load_config(None, {"model": {"stack": "gru", "n_in": 2, "n_hidden": 3, "n_out": 2},
                                 "engine": {"slots": SLOTS, "micro_batch": K, "compile_cache_dir": str(tmp_path)},
                                 "sockets": ipc_sockets(sock),
                                 "publish": {"weights_every": 0}})
        Engine(cfg).close()
        engine = Engine(cfg)
        try:
            store = engine.core.learner.programs.store
            assert store.loaded >= 1 and store.saved == 0
            assert engine.core.learner.programs.is_compiled(None)     # a slot bank's one step program
        finally:
            engine.close()
    finally:
        shutil.rmtree(sock, ignore_errors=True)


def test_a_program_in_jax_cache_is_compiled_afresh_for_the_store(tmp_path):
    """jax's persistent cache already holds the program (an earlier start without the store,
    or other code with the same program): what the store keeps must still run when loaded (an
    executable jax loaded from its cache serializes without its kernels)."""
    from streamtrace.engine.compile_cache import enable
    enable(tmp_path / "jax")
    cfg = config()
    plain = build_learner(cfg, slots=SLOTS, shared_weights=False)
    want, _ = run(plain, 4)                        # fills jax's cache
    saved = learner(cfg, tmp_path)
    np.testing.assert_array_equal(run(saved, 4)[0], want)
    assert saved.programs.store.saved == 1
    loaded = learner(cfg, tmp_path)
    got, _ = run(loaded, 4)                        # failed here: "Function ... not found"
    assert loaded.programs.store.loaded == 1
    np.testing.assert_array_equal(got, want)
