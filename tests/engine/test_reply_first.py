"""Reply before learning (engine.reply_first): where a prediction does not depend on its step's
update (supervised mode; forecast with learning.forecast_before_update), a one-step call's
replies leave after a prediction program and before the update runs. The oracles: the same
engine fed the same messages with the option off (replies and state bit for bit), and a learner
stepped directly (its weights after N steps: each message's update applied exactly once)."""
import jax
import numpy as np
import pytest

from streamtrace import wire
from streamtrace.engine import ConfigError, EngineCore, load_config
from streamtrace.recipe.build import build_learner
from streamtrace.learner import Forecast
from streamtrace.learner.programs import Programs

N_IN, N_OUT, T = 2, 2, 12

GRU = {"model": {"stack": "gru", "n_hidden": 6}, "learning": {"lr": 1e-2, "mode": "supervised"}}
CASES = {
    "gru-f32": GRU,
    "gru-f64": {**GRU, "model": {"stack": "gru", "n_hidden": 6, "precision": 64}},
    "gru-shared": {**GRU, "engine": {"shared_weights": True}},
    "default": {"model": {"n_hidden": 20}, "learning": {"mode": "supervised"}, "transform": {"normalise_warmup": 3}},
    "default-forecast-before": {"model": {"n_hidden": 20}, "transform": {"normalise_warmup": 3},
                                "learning": {"mode": "forecast", "forecast_before_update": True}},
}


def config(case, slots, reply_first=True):
    sections = {k: dict(v) for k, v in CASES[case].items()}
    forecast = sections["learning"]["mode"] == "forecast"
    sections["model"].update(n_in=N_IN, n_out=N_IN if forecast else N_OUT)
    sections["engine"] = {**sections.get("engine", {}), "slots": slots, "micro_batch": 4, "park_s": 0,
                          "reply_first": reply_first}
    return load_config(None, {**sections, "publish": {"weights_every": 0}})


class Spy:
    """The order of prediction programs, updates and early sends, per tick."""

    def __init__(self, monkeypatch):
        self.events = []
        for name in ("run_predict", "run", "run_loop", "run_subset"):
            orig = getattr(Programs, name)
            monkeypatch.setattr(Programs, name, self._wrap(name, orig))

    def _wrap(self, name, orig):
        def call(programs, *a, **k):
            self.events.append("predict" if name == "run_predict" else "update")
            return orig(programs, *a, **k)
        return call


def feed(core, waves, send):
    """Each wave: the streams that send one message, then one tick. Returns every reply's
    bytes in order, early ones included."""
    rng = np.random.default_rng(7)
    dt = core.learner.x_dtype
    seqs, replies = {}, []
    supervised = core.cfg.learning.mode == "supervised"
    for streams in waves:
        for s in streams:
            x = rng.normal(size=N_IN).astype(dt)
            y = rng.normal(size=N_OUT).astype(dt) if supervised else None
            seq = seqs[s] = seqs.get(s, -1) + 1
            assert core.ingest(wire.data_message(f"s{s}", seq, x, y), b"origin") == []
        early = []
        outs = core.tick(early.extend if send else None)
        replies += [raw for kind, _, raw in early + outs if kind == "reply"]
    return replies


def slot_states(core):
    return {k: np.asarray(v) for k, v in core.learner.state_dict().items()}


# a lone stream (8 slots: the two-slot subset call), then five (the call over all slots)
WAVES = [[0]] * T + [[0, 1, 2, 3, 4]] * T


# float64 and the forecast before the update are covered by the default learner's cases (a
# float64 reservoir); separate GRU cases for them cost the suite ~20 s for nothing new
@pytest.mark.parametrize("case,slots", [("gru-f32", 8), ("gru-f32", 1)] +
                         [pytest.param(c, 8, marks=pytest.mark.slow) for c in ("gru-shared", "default",
                                                                                "default-forecast-before")])
def test_replies_and_state_equal_the_plain_engine(case, slots, monkeypatch):
    plain = EngineCore(config(case, slots, reply_first=False))
    plain.warmup()
    want = feed(plain, WAVES if slots > 1 else [[0]] * T, send=True)
    core = EngineCore(config(case, slots))
    core.warmup()
    spy = Spy(monkeypatch)
    got = feed(core, WAVES if slots > 1 else [[0]] * T, send=True)
    assert core.reply_first
    assert got == want                     # every reply's bytes: prediction, loss, seq, steps
    a, b = slot_states(plain), slot_states(core)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # every tick: its prediction program, then (after the replies went out) its update: one
    # call over the busy slots with shared weights, one per busy stream with a model each
    waves = WAVES if slots > 1 else [[0]] * T
    tick = (lambda w: ["predict"] * len(w) + ["update"] * len(w)) if core.banked else (lambda w: ["predict", "update"])
    assert spy.events == [e for w in waves for e in tick(w)]


def test_replies_leave_before_the_update(monkeypatch):
    core = EngineCore(config("gru-f32", 8))
    core.warmup()
    spy = Spy(monkeypatch)
    before = core.learner.stats()["updates"]
    seen = []

    def send(outs):
        seen.append((list(spy.events), [k for k, _, _ in outs], core.steps))
    core.ingest(wire.data_message("a", 0, np.ones(N_IN, np.float32), np.ones(N_OUT, np.float32)), b"o")
    assert core.tick(send) == []            # everything went out early
    assert seen == [(["predict"], ["reply", "pub"], 0)]      # sent with no update run yet
    assert spy.events == ["predict", "update"]
    assert core.learner.stats()["updates"] == before + 1
    assert core.metrics.counters["replied_first"] == 1 and core.metrics.counters["answered"] == 1


def test_without_a_sender_or_with_a_burst_no_prediction_program_runs(monkeypatch):
    """No sender (the engine under load, a label's steps), or two steps queued for a stream
    (the second prediction depends on the first update): no prediction program."""
    core = EngineCore(config("gru-f32", 8))
    core.warmup()
    spy = Spy(monkeypatch)
    x, y = np.ones(N_IN, np.float32), np.ones(N_OUT, np.float32)
    core.ingest(wire.data_message("a", 0, x, y), b"o")
    assert [k for k, _, _ in core.tick()] == ["reply", "pub"]
    for seq in (1, 2):
        core.ingest(wire.data_message("a", seq, x, y), b"o")
    early = []
    assert [k for k, _, _ in core.tick(early.extend)] == ["reply", "pub"] * 2
    # no prediction program: one update call for the first tick, and for the burst one call
    # (shared weights: a loop of two steps) or one per step (a model per stream: a slot bank)
    assert early == [] and spy.events == ["update"] * (3 if core.banked else 2)


def test_each_message_updates_once_as_a_learner_stepped_directly(monkeypatch):
    """A one-slot engine replying first against the learner stepped by hand: predictions,
    losses and the final state bit for bit, and the update count equal to the messages."""
    cfg = config("gru-f64", 1)
    core = EngineCore(cfg)
    core.warmup()
    spy = Spy(monkeypatch)
    learner = build_learner(cfg, slots=1, shared_weights=False)
    rng = np.random.default_rng(3)
    for seq in range(T):
        x, y = rng.normal(size=N_IN), rng.normal(size=N_OUT)
        early = []
        core.ingest(wire.data_message("a", seq, x, y), b"o")
        core.tick(early.extend)
        reply = wire.decode(next(raw for kind, _, raw in early if kind == "reply"))
        want = learner.step(x[None], y[None])
        np.testing.assert_array_equal(wire.unpack_array(reply["pred"]), want.prediction[0])
        assert reply["loss"] == float(want.loss[0])
    assert spy.events == ["predict", "update"] * T
    assert learner.stats()["updates"] == T
    assert core.learner.stats()["updates"] == T
    a, b = learner.state_dict(), core.learner.state_dict()
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_forecast_before_update_predicts_with_the_weights_before_the_step():
    """Oracle: the same learner's state before step t, stepped with learning off (no update
    at all), predicts what the before_update learner answers at step t. The usual forecast
    (after the update) differs once the weights move."""
    def make(before):
        cfg = load_config(None, {"model": {"stack": "gru", "n_in": N_IN, "n_hidden": 5, "n_out": N_IN},
                                 "learning": {"mode": "forecast", "lr": 0.05, "forecast_before_update": before}})
        return build_learner(cfg)
    early, late, probe = make(True), make(False), make(False)
    rng = np.random.default_rng(5)
    moved = 0
    for t in range(T):
        x = np.sin(0.4 * t + np.arange(N_IN)) + 0.1 * rng.normal(size=N_IN).astype(np.float32)
        x = x.astype(np.float32)
        probe.load_state_dict(late.state_dict())
        want = probe.step(x, learn=np.zeros(1, bool)).prediction          # the weights before step t
        got, usual = early.step(x).prediction, late.step(x).prediction
        np.testing.assert_array_equal(got, want)
        moved += not np.array_equal(got, usual)
    assert moved >= T - 3        # after the first steps the updated weights answer otherwise
    for k, v in early.state_dict().items():     # the update itself is the same
        if "prequential" not in k and "roll" not in k and "pending" not in k:
            np.testing.assert_array_equal(np.asarray(v), np.asarray(late.state_dict()[k]), err_msg=k)


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ConfigError, match="learning.forecast_before_update"):
        load_config(None, {"model": {"stack": "gru", "n_in": 1, "n_out": 1},
                           "learning": {"mode": "supervised", "forecast_before_update": True}})
    with pytest.raises(ConfigError, match="engine.reply_first"):
        load_config(None, {"engine": {"reply_first": "yes"}})
    with pytest.raises(ValueError, match="before_update"):
        Forecast(before_update=1)


def test_the_loop_backs_off_while_updates_hold_messages_up():
    """The serve loop replies first only while that pays: an update that held up a message
    (found waiting when the call ended) makes the next 1, 2, 4 .. 64 calls reply after their
    update; one that held nothing up ends it. Never with messages waiting, never when off."""
    from streamtrace.engine.reply_first import MAX_BACKOFF, ReplyFirst
    send = object()
    r = ReplyFirst(True)
    assert r.sender(send, quiet=True) is send and r.sender(send, quiet=False) is None
    for skip in (1, 2, 4, 8, 16, 32, 64, 64):
        r.outcome(held_up=True)
        assert [r.sender(send, quiet=True) for _ in range(skip)] == [None] * skip
        assert r.sender(send, quiet=True) is send
    assert skip == MAX_BACKOFF
    r.outcome(held_up=False)
    r.outcome(held_up=True)
    assert r.sender(send, quiet=True) is None and r.sender(send, quiet=True) is send
    assert ReplyFirst(False).sender(send, quiet=True) is None
