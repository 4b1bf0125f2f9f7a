"""Cold start (jax's persistent compilation cache, the 1-step program first, the rest after
the first answer) and ``streamtrace bench --config``."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

from streamtrace import wire
from streamtrace.engine import load_config
from streamtrace.recipe.build import build_learner
from streamtrace.engine.compile_cache import DEFAULT_DIR, disable, enable, entries
from streamtrace.engine.core import EngineCore
from streamtrace.engine.server import Engine

N_IN = 2


@pytest.fixture(autouse=True)
def _no_cache_after():
    """The cache setting is process-wide: later tests must not write into a deleted folder."""
    yield
    disable()


@pytest.fixture
def sock_dir():
    d = Path(tempfile.mkdtemp(prefix="st-cs-", dir="/tmp"))   # ipc paths must stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


def config(sock_dir=None, hidden=4, **engine):
    sections = {"model": {"stack": "gru", "n_in": N_IN, "n_hidden": hidden, "n_out": N_IN},
                "learning": {"mode": "forecast", "lr": 1e-2}, "engine": {"slots": 2, **engine},
                "publish": {"weights_every": 0}}
    if sock_dir is not None:
        sections["sockets"] = {"router": f"ipc://{sock_dir}/r", "pull": "", "pub": ""}
    return load_config(None, sections)


class CacheEvents:
    """Counts jax's persistent-cache events while in use."""

    def __init__(self):
        self.hits = self.requests = 0

    def __call__(self, event, **kw):
        if event == "/jax/compilation_cache/cache_hits":
            self.hits += 1
        elif event == "/jax/compilation_cache/compile_requests_use_cache":
            self.requests += 1

    def __enter__(self):
        jax.monitoring.register_event_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_listener(self)


def start_and_close(cfg):
    engine = Engine(cfg)
    engine.close()
    return engine


def test_cache_is_on_by_default_and_a_second_start_loads_from_it(tmp_path, sock_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = config(sock_dir, hidden=5)
    assert cfg.engine.compile_cache_dir == DEFAULT_DIR
    folder = tmp_path / "home" / ".cache" / "streamtrace" / "jax"
    with CacheEvents() as first:
        engine = start_and_close(cfg)
    assert engine.cache_dir == folder
    written = {p.name for p in entries(folder)}
    assert written, "the first start wrote no cache entries"
    assert first.requests > 0

    with CacheEvents() as second:
        start_and_close(cfg)                  # a fresh learner: new jit objects, same programs
    assert second.hits > 0, "the second start did not load any program from the cache"
    # every program the second start needed was found: nothing new was written
    assert {p.name for p in entries(folder)} == written


def test_cache_off_writes_no_folder_even_after_another_engine_used_one(tmp_path, sock_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    used = tmp_path / "used"
    start_and_close(config(sock_dir, compile_cache_dir=str(used)))
    before = {p.name for p in entries(used)}
    assert before
    with CacheEvents() as events:
        engine = start_and_close(config(sock_dir, hidden=7, compile_cache_dir=""))   # new programs
    assert engine.cache_dir is None
    assert events.requests == 0 and events.hits == 0
    assert not (tmp_path / "home").exists()
    assert {p.name for p in entries(used)} == before


def test_an_unusable_cache_folder_starts_the_engine_without_a_cache(tmp_path, sock_dir):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    engine = start_and_close(config(sock_dir, compile_cache_dir=str(blocker / "jax")))
    assert engine.cache_dir is None and blocker.read_text() == "not a folder"


def test_compile_cache_dir_must_be_a_path():
    from streamtrace.engine import ConfigError
    with pytest.raises(ConfigError, match="engine.compile_cache_dir"):
        load_config(None, {"engine": {"compile_cache_dir": 3}})
    with pytest.raises(ConfigError, match="engine.compile_cache_dir"):
        load_config(None, {"engine": {"compile_cache_dir": "a\x00b"}})


def test_enable_keeps_small_programs(tmp_path):
    enable(tmp_path / "c")
    jax.jit(lambda v: v * 3.0 - 1.0).lower(np.zeros(3, np.float32)).compile()   # compiles in ~ms
    assert entries(tmp_path / "c")


# ---- the first answer before the micro-batch sizes ----------------------------------------------
def data(stream, seq, x):
    return wire.encode({"type": "data", "stream": stream, "seq": seq, "x": wire.pack_array(x)})


def preds(outs):
    return [wire.decode(raw)["pred"] for kind, _, raw in outs if kind == "reply"]


def test_first_answers_wait_for_no_micro_batch_size_and_match_a_plain_learner():
    cfg = config(micro_batch=4, park_s=10.0)
    core = EngineCore(cfg)
    core.warmup_first()
    assert core.ready == [1]
    xs = np.random.default_rng(0).normal(size=(6, N_IN)).astype(np.float32)
    got = []
    for t, x in enumerate(xs):                # queued together: a burst the micro-batch would take
        assert core.ingest(data("a", t, x), b"o") == []
    while core.has_pending():
        got += preds(core.tick())
    assert not [k for k in core.learner.programs.keys() if isinstance(k, int)], "a micro-batch size was compiled"
    # the oracle: the same config's learner stepped once per sample, outside the engine
    ref = build_learner(cfg, slots=2, shared_weights=False)
    want = [ref.step(np.stack([x, np.zeros(N_IN, np.float32)]), active=np.array([True, False])).prediction[0]
            for x in xs]
    np.testing.assert_allclose(np.array([wire.unpack_array(p) for p in got]), np.array(want), rtol=1e-6, atol=1e-7)

    # the other programs compile later (on a thread while the engine serves) and never touch
    # the state; an engine without subset calls has one step program: no micro-batch sizes
    before = core.learner.state_dict()
    for _ in core.warmup_later():
        pass
    assert core.ready == [1] and not [k for k in core.learner.programs.keys() if isinstance(k, int)]
    # (a slot bank resets a slot with a copy of its first state: no reset program)
    assert core.banked and core.learner.programs.is_compiled("read_slot")
    after = core.learner.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_engine_compiles_the_other_programs_on_a_thread_while_it_answers(sock_dir):
    """Only the 1-step program before listening; the rest compile on a thread of their own
    while the engine answers with what is ready, and every answer is the same bits as an
    engine that had compiled everything first."""
    engine = Engine(config(sock_dir, micro_batch=4, slots=8, compile_cache_dir=""))
    ref = EngineCore(config(micro_batch=4, slots=8))
    ref.warmup()
    try:
        L = engine.core.learner     # a model per stream: a slot bank, its one step program first
        assert engine.core.banked and L.programs.keys() == [None]
        assert not L.programs.is_compiled("read_slot") and not L.programs.is_compiled("write_slot")
        engine.start_warmup()
        xs = np.random.default_rng(4).normal(size=(40, N_IN)).astype(np.float32)
        got, want = [], []
        for t, x in enumerate(xs):               # answered while the thread compiles
            for core, out in ((engine.core, got), (ref, want)):
                assert core.ingest(data("a", t, x), b"o") == []
                while core.has_pending():
                    out += preds(core.tick())
        assert engine.warm.wait(120)
        assert L.programs.is_compiled("read_slot") and L.programs.is_compiled("write_slot")
        assert [wire.unpack_array(p).tobytes() for p in got] == [wire.unpack_array(p).tobytes() for p in want]
    finally:
        engine.close()


def test_a_program_that_fails_to_compile_leaves_the_engine_serving_with_the_others(sock_dir, monkeypatch):
    # shared weights: the engine with subset programs (a slot bank has none)
    engine = Engine(config(sock_dir, micro_batch=2, slots=8, compile_cache_dir="", shared_weights=True))
    try:
        def failing(m, k):
            raise MemoryError("simulated: no memory for the subset program")
        monkeypatch.setattr(engine.core.learner.programs, "subset", failing)
        engine.start_warmup()
        assert engine.warm.wait(120) and engine.core.ready_subsets == []
        rng = np.random.default_rng(3)
        for t in range(3):                        # a burst: served by the program over all slots
            assert engine.core.ingest(data("a", t, rng.normal(size=N_IN).astype(np.float32)), b"o") == []
        got = []
        while engine.core.has_pending():
            got += preds(engine.core.tick())
        assert len(got) == 3
    finally:
        engine.close()


# ---- streamtrace bench --config ------------------------------------------------------------------
def test_bench_config_json_has_every_field_and_counts_trace_bytes(tmp_path, capsys):
    from streamtrace.commands.cli import main
    path = tmp_path / "mine.toml"
    # the user's own model (tests/models.py: a LIF layer and a readout), as serve would build it
    path.write_text('[model]\nfactory = "models:lif_net"\nn_in = 3\nn_out = 2\n'
                    '[learning]\nmode = "supervised"\n[engine]\nslots = 8\n')
    assert main(["bench", "--config", str(path), "--json", "--iters", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "models:lif_net" and out["n_in"] == 3 and out["e2e"] is None
    assert out["dispatch_floor_us"]["p50"] > 0 and out["dispatch_floor_us"]["n"] > 0
    runs = {(r["algorithm"], r["slots"]): r for r in out["runs"]}
    assert set(runs) == {("d-rtrl", 1), ("d-rtrl", 8), ("es-d-rtrl", 1), ("es-d-rtrl", 8)}
    cfg = load_config(path)
    for (algorithm, slots), r in runs.items():
        assert r["compile_s"] > 0 and r["build_s"] > 0
        assert r["step_us"]["n"] == 5 and 0 < r["step_us"]["p50"] <= r["step_us"]["p99"]
        # from 8 slots on: also one busy stream's call (a subset of the slots)
        assert ("one_busy_us" in r) == (slots > 1) and (slots == 1 or r["one_busy_us"]["n"] == 5)
        cfg.learning.algorithm = algorithm
        state = build_learner(cfg, slots=slots, shared_weights=False).state_dict()
        # an independent count: slot 0's share of every trace array the learner saves
        want = sum(np.asarray(v)[0].nbytes for k, v in state.items() if k.startswith("traces."))
        assert r["trace_bytes_per_slot"] == want > 0
    assert runs["es-d-rtrl", 1]["trace_bytes_per_slot"] < runs["d-rtrl", 1]["trace_bytes_per_slot"]


def test_bench_config_refuses_a_bad_config_in_one_line(tmp_path, capsys):
    from streamtrace.commands.cli import main
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nn_hidden = 0\n')
    assert main(["bench", "--config", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: model.n_hidden")
