"""Same input, same answers: a stream's predictions, losses and state are bit-identical
whatever else the engine is doing -- other streams in the same ticks, bursts of any size, any
interleaving. The oracle is the stream run alone: one message per tick, nothing else in the
engine. (A model per stream is a slot bank, every step through one program: learner/bank.py.
Before it, the engine chose among subset, loop and one-step programs, and this test also
switched which of them were compiled.)"""
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from streamtrace import wire
from streamtrace.engine import EngineCore, load_config
from configs import ipc_sockets  # noqa: E402

N_IN, T = 2, 10
SLOTS, MICRO_BATCH = 16, 4


CASES = {    # a GRU learning its weights by D-RTRL, in float32 and float64; the default learner
             # (a float64 reservoir, normalised residual inputs, an RLS readout, the experts)
    "gru-f32": {"model": {"stack": "gru", "n_hidden": 6, "precision": 32}, "learning": {"lr": 1e-2}},
    "gru-f64": {"model": {"stack": "gru", "n_hidden": 6, "precision": 64}, "learning": {"lr": 1e-2}},
    "default": {"model": {"n_hidden": 20}, "transform": {"normalise_warmup": 3}},
}


def make_core(case):
    sections = {k: dict(v) for k, v in CASES[case].items()}
    sections["model"].update(n_in=N_IN, n_out=N_IN)
    sections.setdefault("learning", {})["mode"] = "forecast"
    cfg = load_config(None, {**sections,
                             "engine": {"slots": SLOTS, "micro_batch": MICRO_BATCH, "park_s": 0, "idle_timeout_s": 1.0},
                             "publish": {"weights_every": 0, "predictions": False}})
    clock = [0.0]
    core = EngineCore(cfg, clock=lambda: clock[0])
    core.warmup()
    core.clock_box = clock
    return core


def stream_inputs(index, dtype):
    rng = np.random.default_rng(100 + index)
    t = np.arange(T)[:, None]
    x = np.sin(0.3 * t + index + np.arange(N_IN)) + 0.2 * rng.normal(size=(T, N_IN))
    return x.astype(dtype)


def data(stream, seq, x):
    return wire.encode({"type": "data", "stream": stream, "seq": seq, "x": wire.pack_array(x)})


def slot_state(core, slot):
    """A slot's whole state, flattened (its counters too: a slot counts its own steps only)."""
    leaves = jax.tree_util.tree_flatten_with_path(core.learner.read_slot(slot))[0]
    return {jax.tree_util.keystr(path): np.asarray(v) for path, v in leaves}


def free_all(core):
    """Every stream leaves (idle past the timeout): the next names get fresh slots."""
    core.clock_box[0] += 10.0
    core.evict_idle()
    assert not core.streams


def drain(core, got):
    while core.has_pending():
        for kind, _, raw in core.tick():
            msg = wire.decode(raw)
            assert kind == "reply" and msg["type"] == "prediction", msg
            got.setdefault(msg["stream"], []).append((wire.unpack_array(msg["pred"]), msg["loss"]))


class Oracle:
    """Per case: the engine, each stream's inputs, and each stream's answers and final state
    when run alone (computed once, on first use)."""

    def __init__(self, case):
        self.core = make_core(case)
        self.dtype = self.core.learner.x_dtype
        self.inputs = [stream_inputs(i, self.dtype) for i in range(SLOTS)]
        self.alone = {}
        self.run = 0

    def reference(self, index, steps):
        if index not in self.alone:
            core, name, got = self.core, f"alone{index}", {}
            for t in range(T):
                core.ingest(data(name, t, self.inputs[index][t]), b"o")
                drain(core, got)
                if t + 1 in (3, 5, 7, T):
                    self.alone[(index, t + 1)] = slot_state(core, core.streams[name].slot)
            self.alone[index] = got[name]
            free_all(core)
        return self.alone[index][:steps], self.alone[(index, steps)]


ORACLES = {}


def oracle(case):
    if case not in ORACLES:
        ORACLES[case] = Oracle(case)
    return ORACLES[case]


STEPS = (3, 5, 7, T)     # how many steps a stream sends (its state is checked after them)


@hs.composite
def schedules(draw):
    n = draw(hs.integers(1, SLOTS))
    streams = draw(hs.permutations(range(SLOTS)))[:n]
    steps = {s: draw(hs.sampled_from(STEPS)) for s in streams}
    events = draw(hs.lists(hs.one_of(hs.tuples(hs.sampled_from(streams), hs.integers(1, 6)), hs.just("tick")),
                           max_size=40))
    return streams, steps, events


@pytest.mark.parametrize("case", list(CASES))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=schedules())
def test_each_stream_gets_the_same_bits_as_alone_whatever_shares_its_calls(case, plan):
    orc = oracle(case)
    core = orc.core
    streams, steps, events = plan
    orc.run += 1
    names = {s: f"r{orc.run}-{s}" for s in streams}
    sent = {s: 0 for s in streams}
    got = {}
    assert core.banked
    for ev in events:
        if ev == "tick":
            drain(core, got)
            continue
        s, burst = ev
        for _ in range(min(burst, steps[s] - sent[s])):
            core.ingest(data(names[s], sent[s], orc.inputs[s][sent[s]]), b"o")
            sent[s] += 1
    for s in streams:
        while sent[s] < steps[s]:
            core.ingest(data(names[s], sent[s], orc.inputs[s][sent[s]]), b"o")
            sent[s] += 1
    drain(core, got)
    states = {s: slot_state(core, core.streams[names[s]].slot) for s in streams}
    free_all(core)
    for s in streams:
        want, want_state = orc.reference(s, steps[s])
        answers = got[names[s]]
        assert len(answers) == steps[s]
        for t, ((p, loss), (wp, wloss)) in enumerate(zip(answers, want)):
            assert p.dtype == wp.dtype and np.array_equal(p, wp), (s, t, p - wp)
            assert loss == wloss or (loss is None and wloss is None), (s, t, loss, wloss)
        assert states[s].keys() == want_state.keys()
        for k in want_state:
            assert np.array_equal(states[s][k], want_state[k]), (s, k)


def test_the_same_file_replayed_twice_through_serve_gives_the_same_predictions(tmp_path):
    """`streamtrace replay FILE --serve cfg` twice, each with a fresh engine that compiles its
    other programs while it answers (so which program serves which row differs by timing):
    the predictions written are byte for byte the same."""
    import shutil
    import tempfile
    from pathlib import Path

    from streamtrace.commands.cli import main
    from streamtrace.engine.launch import write_config
    t = np.arange(400)
    csv = tmp_path / "series.csv"
    csv.write_text("a,b\n" + "\n".join(f"{np.sin(0.1 * i):.6f},{np.cos(0.13 * i):.6f}" for i in t) + "\n")
    outs = []
    for run in range(2):
        sock = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
        try:
            cfg = write_config(tmp_path / f"engine{run}.toml", {
                "model": {"stack": "gru", "n_in": 2, "n_hidden": 8, "n_out": 2},
                "learning": {"mode": "forecast", "lr": 5e-3},
                "engine": {"slots": 16, "compile_cache_dir": ""},
                "publish": {"weights_every": 0, "predictions": False},
                "sockets": ipc_sockets(sock)})
            out = tmp_path / f"pred{run}.csv"
            assert main(["replay", str(csv), "--serve", str(cfg), "--out", str(out)]) == 0
            outs.append(out.read_bytes())
        finally:
            shutil.rmtree(sock, ignore_errors=True)
    assert len(outs[0].splitlines()) == len(t) + 1
    assert outs[0] == outs[1]
