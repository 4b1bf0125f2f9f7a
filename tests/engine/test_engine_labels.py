"""Delayed labels at the engine (learning.label_delay): a ``label`` message {stream, seq, y}
reaches the step its data message made, as the learner's own ``label`` does; bad labels get
their error code and change nothing; the ring and the streams' recent seqs survive a
checkpoint; configurations the ring cannot serve are refused naming learning.label_delay."""
import jax
import numpy as np
import pytest

from streamtrace import wire
from streamtrace.engine import load_config
from streamtrace.recipe.build import build_learner
from streamtrace.engine.config import ConfigError
from streamtrace.engine.core import EngineCore

N_IN, N_OUT, D = 3, 2, 4


def config(delay=D, **sections):
    learning = {"mode": "supervised", "optimizer": "sgd", "lr": 0.05, "label_delay": delay,
                **sections.pop("learning", {})}
    engine = {"slots": 2, **sections.pop("engine", {})}
    return load_config(None, {"model": {"stack": "gru", "n_in": N_IN, "n_hidden": 4, "n_out": N_OUT},
                              "learning": learning, "engine": engine, "publish": {"weights_every": 0},
                              **sections})


def data(stream, seq, x, y=None, **kw):
    return wire.data_message(stream, seq, x.astype(np.float32), None if y is None else y.astype(np.float32), **kw)


def label(stream, seq, y):
    return wire.label_message(stream, seq, np.asarray(y, np.float32))


def replies(outs):
    return [wire.decode(raw) for kind, _, raw in outs if kind == "reply"]


def run(core, raw):
    out = core.ingest(raw, b"o")
    return replies(out + core.tick())


def series(steps, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(steps, N_IN)).astype(np.float32), rng.normal(size=(steps, N_OUT)).astype(np.float32)


def state_of(core):
    return core.learner.state_dict()


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def streams_state(*learners):
    """The engine's state (a model per stream, a slot each) that one-slot learners of their
    own, one per slot in slot order, give: their states stacked."""
    per = [L.state_dict() for L in learners]
    return {k: np.concatenate([p[k] for p in per]) for k in per[0]}


def test_labels_reach_the_learner_as_its_own_label_calls():
    xs, ys = series(12)
    cfg = config()
    core = EngineCore(cfg)
    # the oracle: stream a's own one-slot learner (slot 1 stays as built)
    ref, idle = (build_learner(cfg, slots=1, shared_weights=False) for _ in range(2))
    lags = {0: 0, 1: 3, 2: 1, 3: None, 4: 2, 5: 0, 6: 3, 7: 1, 8: 2, 9: 0}   # None: never labelled
    arrive = {}
    for t, lag in lags.items():
        if lag is not None:
            arrive.setdefault(t + lag, []).append(t)
    for s in range(10):
        got = run(core, data("a", s, xs[s]))
        want = ref.step(xs[s][None])
        assert got[0]["type"] == "prediction" and got[0]["loss"] is None
        np.testing.assert_array_equal(wire.unpack_array(got[0]["pred"]), want.prediction[0])
        for t in arrive.get(s, []):
            ack = run(core, label("a", t, ys[t]))
            assert ack[0]["type"] == "label_ack" and ack[0]["seq"] == t and ack[0]["applied"], ack
            r = ref.label(ys[t], age=s - t, slot=0)
            assert ack[0]["loss"] == r.loss
    assert same(state_of(core), streams_state(ref, idle))
    assert core.metrics.counters["labels"] == sum(len(v) for s, v in arrive.items() if s < 10)
    c = core.metrics.counters
    assert c["received"] == c["answered"] + c["errors"]


def test_a_y_with_its_x_is_applied_at_once_and_labels_wait_for_queued_steps():
    xs, ys = series(6, seed=1)
    cfg = config()
    core = EngineCore(cfg)
    ref, idle = (build_learner(cfg, slots=1, shared_weights=False) for _ in range(2))
    # a y with its x: stepped and learned from at once
    assert [r["type"] for r in replies(core.ingest(data("a", 0, xs[0], ys[0]), b"o"))] == ["prediction"]
    for s in (1, 2):         # queued, not stepped: the label runs them first, in order
        assert core.ingest(data("a", s, xs[s]), b"o") == []
    out = replies(core.ingest(label("a", 1, ys[1]), b"o"))
    assert [r["type"] for r in out] == ["prediction"] * 2 + ["label_ack"]
    for s in range(3):
        ref.step(xs[s][None])
        if s == 0:
            ref.label(ys[0], age=0, slot=0)
    ref.label(ys[1], age=1, slot=0)
    assert same(state_of(core), streams_state(ref, idle))


def test_bad_labels_get_their_code_and_change_nothing():
    xs, ys = series(8, seed=2)
    core = EngineCore(config())
    for s in range(6):
        run(core, data("a", s, xs[s], mode="predict" if s == 4 else None))
    assert run(core, label("a", 2, ys[2]))[0]["type"] == "label_ack"
    nan = np.array([np.nan, 0.0], np.float32)
    cases = [(label("b", 0, ys[0]), "unknown_label"),           # a stream with no slot
             (label("a", 6, ys[0]), "unknown_label"),           # no data with that seq yet
             (label("a", 4, ys[0]), "unknown_label"),           # data in predict mode: nothing kept
             (label("a", 2, ys[2]), "already_labelled"),
             (label("a", 1, ys[1]), "label_too_late"),          # 4 data messages after it
             (label("a", 0, ys[0]), "label_too_late"),
             (label("a", 3, np.zeros(N_OUT + 1)), "bad_shape"),
             (label("a", 3, nan), "not_finite"),
             (wire.encode({"type": "label", "stream": "a", "seq": 3, "y": wire.pack_array(ys[3]), "x": 1}),
              "unknown_field"),
             (wire.encode({"type": "label", "stream": "a", "seq": -1, "y": wire.pack_array(ys[3])}), "bad_seq"),
             (wire.encode({"type": "label", "stream": "a", "seq": 3}), "missing_field")]
    for raw, code in cases:
        before = state_of(core), {n: (s.slot, s.next_seq, list(s.recent)) for n, s in core.streams.items()}
        got = replies(core.ingest(raw, b"o"))
        assert len(got) == 1 and got[0]["type"] == "error" and got[0]["code"] == code, (code, got)
        assert same(before[0], state_of(core))
        assert before[1] == {n: (s.slot, s.next_seq, list(s.recent)) for n, s in core.streams.items()}
    assert run(core, label("a", 3, ys[3]))[0]["type"] == "label_ack"      # still takes a good one
    plain = EngineCore(config(delay=0))
    run(plain, data("a", 0, xs[0], ys[0]))
    assert run(plain, label("a", 0, ys[0]))[0]["code"] == "bad_type"
    c = core.metrics.counters
    assert c["received"] == c["answered"] + c["errors"]


def test_checkpoint_holds_the_rings_and_the_recent_seqs(tmp_path):
    xs, ys = series(10, seed=3)
    cfg = config(checkpoint={"dir": str(tmp_path), "every": 10_000})
    a = EngineCore(cfg)
    for s in range(5):
        run(a, data("a", s, xs[s]))
    a.save_checkpoint()
    b = EngineCore(cfg)
    assert b.resume() is not None
    assert same(state_of(a), state_of(b))
    for core in (a, b):
        assert run(core, label("a", 3, ys[3]))[0]["type"] == "label_ack"
        for s in range(5, 8):
            run(core, data("a", s, xs[s]))
            assert run(core, label("a", s - 1, ys[s - 1]))[0]["type"] == "label_ack"
        assert run(core, label("a", 3, ys[3]))[0]["code"] == "label_too_late"
    assert same(state_of(a), state_of(b))


def _served(core, events, clock=None):
    """Ingest the events (raw messages, "tick", or ("wait", seconds)); then drain. Returns
    stream 'a's predictions and label losses in order."""
    got = []

    def keep(outs):
        for r in replies(outs):
            if r.get("stream") == "a":
                assert r["type"] in ("prediction", "label_ack"), r
                got.append(wire.unpack_array(r["pred"]) if r["type"] == "prediction" else r["loss"])
    for ev in events:
        if ev == "tick":
            keep(core.tick())
        elif isinstance(ev, tuple):
            clock[0] += ev[1]
            core.evict_idle()
        else:
            keep(core.ingest(ev, b"o"))
    while core.has_pending():
        keep(core.tick())
    return got


def _slot_bits(core, name):
    leaves = jax.tree_util.tree_flatten_with_path(core.learner.read_slot(core.streams[name].slot))[0]
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves if "counters" not in jax.tree_util.keystr(p)}


def test_a_streams_bits_do_not_depend_on_what_shares_its_calls():
    """8 models (a pair of slots per call, a subset program and the loop program): stream 'a'
    with its labels alone, a message per call, against 'a' among three busy streams, its data
    in bursts (micro-batches), a label running its queued steps first, and parked for a while."""
    xs, ys = series(10, seed=4)
    clock = [0.0]
    cfg = config(engine={"slots": 8, "micro_batch": 4, "park_s": 100.0, "idle_timeout_s": 5.0})
    labels_after = {2: [0], 5: [3, 4], 7: [6], 9: [7, 9]}
    mine = []
    for s in range(10):
        mine.append(data("a", s, xs[s]))
        mine += [label("a", t, ys[t]) for t in labels_after.get(s, [])]
    alone = EngineCore(cfg, clock=lambda: clock[0])
    alone.warmup()
    want = _served(alone, [e for m in mine for e in (m, "tick")])
    want_bits = _slot_bits(alone, "a")
    busy = EngineCore(cfg, clock=lambda: clock[0])
    busy.warmup()
    others = [data(f"o{k}", s, xs[(s + k) % 10]) for s in range(10) for k in range(3)]
    events = others[:6] + mine[:4] + ["tick"] + others[6:15] + mine[4:9] + [("wait", 10.0)] + others[15:] \
        + mine[9:]
    got = _served(busy, events, clock)
    assert len(got) == len(want) == 10 + 6
    for g, w in zip(got, want):
        assert (np.array_equal(g, w) if isinstance(w, np.ndarray) else g == w), (g, w)
    bits = _slot_bits(busy, "a")
    assert bits.keys() == want_bits.keys() and all(np.array_equal(bits[k], want_bits[k]) for k in bits)
    assert busy.metrics.counters["unparked"] == 4      # all four streams were parked and came back


@pytest.mark.parametrize("sections", [
    {"learning": {"mode": "forecast", "channels": [0, 1]}},
    {"readout": {"kind": "rls"}},
    {"transform": {"normalise": True}},
    {"learning": {"optimizer": "frozen"}},
    {"learning": {"label_delay": -1}},
])
def test_configurations_the_ring_cannot_serve_are_refused(sections):
    with pytest.raises(ConfigError) as err:
        config(**sections)
    assert err.value.key == "learning.label_delay", err.value


def test_a_cluster_worker_refuses_delayed_labels():
    """The cluster takes data messages only, and a stream moved to another worker would lose its
    window of recent seqs: a worker refuses the setting instead of silently not learning."""
    from streamtrace.cluster.stepper import worker_config
    with pytest.raises(ConfigError) as err:
        worker_config(config())
    assert err.value.key == "learning.label_delay", err.value
    assert worker_config(config(delay=0)).learning.label_delay == 0
