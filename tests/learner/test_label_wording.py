"""Refused labels are said in the user's terms: the engine names the stream and the seq of the
data message, the learner the steps back; neither speaks of slots."""
import numpy as np
import pytest

from streamtrace import wire
from streamtrace.engine import load_config
from streamtrace.engine.core import EngineCore
from streamtrace.learner.labels import LabelError

N_IN, N_OUT, D = 2, 1, 3


def core():
    return EngineCore(load_config(None, {
        "model": {"stack": "gru", "n_in": N_IN, "n_hidden": 4, "n_out": N_OUT},
        "learning": {"mode": "supervised", "optimizer": "sgd", "lr": 0.05, "label_delay": D},
        "engine": {"slots": 2}, "publish": {"weights_every": 0}}))


def send(c, raw):
    return [wire.decode(r) for kind, _, r in c.ingest(raw, b"o") if kind == "reply"]


def x(seq):
    return np.full(N_IN, 0.1 * seq, np.float32)


def test_engine_label_errors_name_stream_and_seq_not_slots():
    c = core()
    send(c, wire.data_message("pump-7", 0, x(0)))
    send(c, wire.data_message("pump-7", 1, x(1), mode="predict"))       # learns nothing: no label
    y = np.ones(N_OUT, np.float32)
    assert send(c, wire.label_message("pump-7", 0, y))[-1]["type"] == "label_ack"
    errors = []
    for seq in (1, 0, 9):
        got = send(c, wire.label_message("pump-7", seq, y))[-1]
        assert got["type"] == "error"
        errors.append((got["code"], got["message"]))
    assert errors[0][0] == "unknown_label"
    assert errors[0][1].startswith("stream 'pump-7': data message seq 1 left nothing to label (it did not learn")
    assert errors[1] == ("already_labelled", "stream 'pump-7': seq 0 was already labelled")
    assert errors[2] == ("unknown_label", "stream 'pump-7': the label of seq 9 has no data message with seq 9 (yet)")
    assert not any("slot" in m for _, m in errors)


def test_learner_label_errors_speak_of_steps_back():
    import streamtrace as st
    from streamtrace.nn import Stack
    learner = st.OnlineLearner(Stack("gru", N_IN, 4, N_OUT), np.zeros(N_IN, np.float32),
                               mode=st.Supervised(label_delay=D))
    learner.step(x(1))
    learner.label(np.ones(N_OUT), age=0)
    with pytest.raises(LabelError, match=r"^the step 0 steps back was already labelled$"):
        learner.label(np.ones(N_OUT), age=0)
    with pytest.raises(LabelError, match=r"^no learning step 1 steps back \(none yet"):
        learner.label(np.ones(N_OUT), age=1)
