"""The exported programs beside the step (streamtrace/export/program.py): the prediction twin,
the label program (learning.label_delay) and the slot reset, run by the jax-free runner,
against the jax learner and ``serve``'s engine core (``EngineCore``) as oracles: the same
replies and error codes to the same label messages, losses and predictions within float32
rounding of IREE against XLA (docs/devices.md), the state untouched by a refusal."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow       # each module's export compiles its programs (~8 s); ~25 s in all

from engine_helpers import answers
from streamtrace import wire
from streamtrace.engine.config import load_config
from streamtrace.engine.core import EngineCore
from streamtrace.export.learner import learner_from_config
from streamtrace.export.write import export_learner
from streamtrace_runner.bank import RunnerBank
from streamtrace_runner.core import Options, RunnerCore
from streamtrace_runner.runtime import Runner, RunnerError

N_IN, N_OUT, D, SLOTS = 3, 2, 4, 2
LABELS = f"""[model]
stack = "gru"
n_in = {N_IN}
n_hidden = 4
n_out = {N_OUT}
[learning]
mode = "supervised"
optimizer = "sgd"
lr = 0.05
label_delay = {D}
"""
F32 = 2e-5          # float32, IREE against XLA (their sums in another order), a few steps


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labels")
    (tmp / "labels.toml").write_text(LABELS)
    export_learner(tmp / "labels.toml", tmp / "out")
    return tmp / "out"


def _series(steps, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(steps, N_IN)).astype(np.float32), rng.normal(size=(steps, N_OUT)).astype(np.float32)


def _engine(folder):
    over = {"engine": {"slots": SLOTS}, "publish": {"weights_every": 0}}
    return EngineCore(load_config(folder.parent / "labels.toml", over))


def _runner(folder):
    return RunnerCore(RunnerBank(Runner(folder), SLOTS), Options(slots=SLOTS, weights_every=0))


def _data(stream, seq, x, y=None, mode="learn"):
    return wire.data_message(stream, seq, x, y, mode=mode)


def _label(stream, seq, y):
    return wire.label_message(stream, seq, np.asarray(y, np.float32))


def _messages():
    """Data of two streams with labels at lags 0..3, one never labelled, a label twice, one too
    late, one for a seq not sent, one for a stream unknown, one for a predict-only step, one
    of a bad shape, one not finite, and a y given with its data (applied at once)."""
    xs, ys = _series(14)
    m = [_label("a", 0, ys[0])]                                # before any data: unknown stream
    for s in range(10):
        m.append(_data("a", s, xs[s], mode="predict" if s == 6 else "learn"))
        m += {1: [_label("a", 1, ys[1])], 3: [_label("a", 2, ys[2]), _label("a", 2, ys[2])],
              4: [_label("a", 0, ys[0])], 5: [_label("a", 3, ys[3]), _label("a", 9, ys[9])],
              7: [_label("a", 6, ys[6]), _label("a", 4, np.zeros(N_OUT + 1)), _label("a", 5, [np.nan] * N_OUT)],
              9: [_label("a", 7, ys[7]), _label("b", 0, ys[0])]}.get(s, [])
    m += [_data("b", 0, xs[10], ys[10]), _data("b", 1, xs[11]), _label("b", 0, ys[10]), _label("b", 1, ys[11]),
          _data("a", 10, xs[12]), _label("a", 10, ys[12])]
    return m


def test_labels_get_serves_replies_and_errors(folder):
    """The same replies in the same order from the runner and ``serve``'s core: predictions and
    label_acks (loss, applied) equal within float32 rounding, error codes, streams and seqs
    equal, and the counters of labels and updates."""
    msgs = _messages()
    engine, runner = _engine(folder), _runner(folder)
    got_e, got_r = answers(engine, msgs), answers(runner, msgs)
    assert [r["type"] for r in got_r] == [r["type"] for r in got_e]
    errors = lambda got: [(r["code"], r.get("stream"), r.get("seq")) for r in got if r["type"] == "error"]
    assert errors(got_r) == errors(got_e)
    assert [c for c, _, _ in errors(got_r)] == ["unknown_label", "already_labelled", "label_too_late",
                                                 "unknown_label", "unknown_label", "bad_shape", "not_finite",
                                                 "unknown_label", "already_labelled"]
    for r, e in zip(got_r, got_e):
        if e["type"] == "label_ack":
            assert (r["stream"], r["seq"], r["applied"]) == (e["stream"], e["seq"], e["applied"])
            assert abs(r["loss"] - e["loss"]) <= F32 * abs(e["loss"])
        if e["type"] == "prediction":
            a, b = wire.unpack_array(r["pred"]), wire.unpack_array(e["pred"])
            np.testing.assert_allclose(a, b, rtol=F32, atol=1e-6)
            assert (r["loss"] is None) == (e["loss"] is None)
    assert runner.counters["labels"] == engine.metrics.counters["labels"] == 7
    assert runner.errors == engine.metrics.errors_by_code


def test_a_refused_label_changes_nothing(folder):
    """A label refused by the program (already labelled, not finite) leaves every state array
    as it was, bit for bit; an applied one moves the weights."""
    xs, ys = _series(3)
    runner = Runner(folder)
    for x in xs:
        runner.step(x[None])
    assert runner.label(ys[1], age=1)[0] == 0
    before = runner.state_dict()
    assert runner.label(ys[1], age=1)[0] == 3                 # already labelled
    assert runner.label(np.full(N_OUT, np.nan, np.float32), age=0)[0] == 4
    after = runner.state_dict()
    assert all(np.array_equal(before[k], after[k], equal_nan=True) for k in before)
    status, loss, applied = runner.label(ys[2], age=0)
    assert status == 0 and applied and np.isfinite(loss)
    assert any(not np.array_equal(before[k], runner.state_dict()[k]) for k in before if k.startswith("params."))


def test_the_label_program_equals_the_learners(folder):
    """The runner's label against the jax learner's ``label`` after the same steps: the same
    status, the loss and the weights within float32 rounding."""
    xs, ys = _series(6, seed=1)
    runner, learner = Runner(folder), learner_from_config(folder.parent / "labels.toml")[1]
    for t, x in enumerate(xs):
        runner.step(x[None])
        learner.step(x[None])
        if t >= 2:
            status, loss, applied = runner.label(ys[t - 2], age=2)
            want = learner.label(ys[t - 2], age=2, slot=0)
            assert status == 0 and applied == want.applied
            assert abs(loss - want.loss) <= F32 * abs(want.loss)
    mine, theirs = runner.state_dict(), learner.state_dict()
    for k in theirs:
        if k.startswith("params."):
            np.testing.assert_allclose(mine[k], theirs[k], rtol=F32, atol=1e-6)


def test_the_prediction_twin_predicts_without_stepping(folder):
    """``predict``: the step's prediction (within float32 rounding: a module of its own) and no
    state written; ``step`` after it continues as without it."""
    xs, _ = _series(5, seed=2)
    runner, clean = Runner(folder), Runner(folder)
    for x in xs:
        before = runner.state_dict()
        twin = runner.predict(x[None])[0]
        assert all(np.array_equal(before[k], v) for k, v in runner.state_dict().items())
        got, want = runner.step(x[None])[0], clean.step(x[None])[0]
        assert np.array_equal(got, want)
        np.testing.assert_allclose(twin, got, rtol=F32, atol=1e-7)


def test_the_reset_program_of_several_slots(tmp_path):
    """An export of two slots has a reset program and no label program (no label_delay): a
    reset slot holds the initial state again, bit for bit, the other slot is untouched, and the
    runner goes on as the jax learner whose slot was reset."""
    gru = tmp_path / "gru.toml"
    gru.write_text('[model]\nstack = "gru"\nn_hidden = 2\n')
    manifest = export_learner(gru, tmp_path / "out", slots=2)
    assert sorted(manifest["programs"]) == ["predict", "reset", "step"]
    runner, learner = Runner(tmp_path / "out"), learner_from_config(gru, slots=2)[1]
    with pytest.raises(RunnerError, match="no label program"):
        runner.label(np.zeros(1, np.float32), 0)
    initial = runner.state_dict()
    xs = np.random.default_rng(3).normal(size=(6, 2, 1)).astype(np.float32)
    for x in xs[:4]:
        runner.step(x, x)
        learner.step(x, x)
    before = runner.state_dict()
    runner.reset(1)
    learner.reset_slot(1)
    after, want = runner.state_dict(), learner.state_dict()
    for k in initial:
        if before[k].shape[:1] == (2,) and not k.startswith("stats."):
            assert np.array_equal(after[k][1], initial[k][1]), k
            assert np.array_equal(after[k][0], before[k][0]), k
    for x in xs[4:]:
        got, wanted = runner.step(x, x)[0], np.asarray(learner.step(x, x).prediction)
        np.testing.assert_allclose(got, wanted, rtol=F32, atol=1e-6)


def _answered_first(core, msgs, engine: bool):
    """Each message handled as its server's loop does when nothing else waits (a sender for
    replies that may go before the step): (decoded replies in order, how many went first)."""
    got, first = [], 0
    for raw in msgs:
        early = []
        if engine:
            outs = core.ingest(raw, b"o")
            while core.has_pending():
                outs += core.tick(early.extend)
        else:
            outs = core.ingest(raw, b"o", early.extend)
        first += sum(kind == "reply" for kind, _, _ in early)
        got += [wire.decode(r) for kind, _, r in early + outs if kind == "reply"]
    return got, first


def test_reply_first_with_delayed_labels_as_serve(folder):
    """Replying first (supervised: allowed) with delayed labels: the data messages without
    their y answered from the twin, the one with its y (its label applied at once) after its
    step, as ``serve``'s core does; the same replies and counts."""
    msgs = _messages()
    engine, runner = _engine(folder), _runner(folder)
    engine.warmup()
    (got_e, first_e), (got_r, first_r) = _answered_first(engine, msgs, True), _answered_first(runner, msgs, False)
    assert [r["type"] for r in got_r] == [r["type"] for r in got_e]
    data = sum(r["type"] == "prediction" for r in got_e)
    assert first_r == first_e == runner.counters["replied_first"] == data - 1      # not b's seq 0 (its y given)
    for r, e in zip(got_r, got_e):
        if e["type"] == "prediction":
            np.testing.assert_allclose(wire.unpack_array(r["pred"]), wire.unpack_array(e["pred"]), rtol=F32, atol=1e-6)
    assert runner.counters["labels"] == engine.metrics.counters["labels"] == 7
