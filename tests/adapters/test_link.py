"""EngineLink (adapters/link.py), the bridges' pipelined connection to a real engine.

Oracles: the rows sent (every (stream, seq) answered once, timestamps echoed), a hand-fed
SensorClient on the same engine (the numbering the engine expects after a restart), and the
engine's own refusal codes.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from engine_helpers import running_engine
from streamtrace.transport import SensorClient
from streamtrace.adapters.link import EngineLink

GRU = {
    "model": {"stack": "gru", "n_in": 2, "n_hidden": 8, "n_out": 2},
    "learning": {"algorithm": "d-rtrl", "mode": "forecast", "optimizer": "adam", "lr": 5e-3},
    "engine": {"slots": 8, "micro_batch": 1, "park_s": 0.0},
    "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False},
    "checkpoint": {"dir": ""},
}


def drain(link, want, timeout=60.0):
    got, end = [], time.monotonic() + timeout
    while len(got) < want and time.monotonic() < end:
        got += link.poll(0.5)
    return got


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("link"), GRU) as (proc, ep, _):
        with SensorClient(ep["router"], stream="warm", timeout_s=120) as c:
            c.step(np.zeros(2))          # waits for the engine's first program
        yield ep


def test_pipelined_streams_are_answered_in_order_with_their_timestamps(engine):
    link = EngineLink(engine["router"])
    sent = {}
    for i in range(30):
        for s in ("a", "b"):
            ts = 1000.0 + i + (0.5 if s == "b" else 0.0)
            seq = link.send(s, [np.sin(0.2 * i), np.cos(0.2 * i)], ts=ts)
            sent[(s, seq)] = ts
    answers = drain(link, len(sent))
    link.close()
    assert sorted((a.stream, a.seq) for a in answers) == sorted(sent)
    assert all(a.error is None and a.pred.shape == (2,) and np.all(np.isfinite(a.pred)) for a in answers)
    assert all(a.ts == sent[(a.stream, a.seq)] and a.rtt_s > 0 for a in answers)
    for s in ("a", "b"):                      # per stream, answers come in the order sent
        seqs = [a.seq for a in answers if a.stream == s]
        assert seqs == sorted(seqs) == list(range(30))
    assert link.counts["sent"] == link.counts["answered"] == 60 and link.in_flight == 0


def test_a_restarted_bridge_continues_the_engines_numbering(engine):
    with SensorClient(engine["router"], stream="kept") as c:
        for i in range(12):
            c.step([0.1 * i, 0.0])
        expected = c.seq                       # what the engine waits for next
    link = EngineLink(engine["router"])        # a new bridge process knows nothing of it
    for i in range(5):
        link.send("kept", [0.0, 0.1 * i])
    first = drain(link, 5)
    refused = [a for a in first if a.error is not None]
    assert [a.error for a in refused] == ["repeat"] * 5 and link.counts["resynced"] == 1
    assert link.next_seq["kept"] == expected   # adopted once; stale refusals ignored
    link.send("kept", [1.0, 1.0])
    (after,) = drain(link, 1)
    link.close()
    assert after.error is None and after.seq == expected


def test_a_non_finite_sample_is_refused_here_without_using_a_number(engine):
    link = EngineLink(engine["router"])
    with pytest.raises(ValueError, match="NaN or Inf"):
        link.send("nf", [np.nan, 0.0])
    assert link.send("nf", [0.0, 0.0]) == 0
    (a,) = drain(link, 1)
    link.close()
    assert a.error is None and a.seq == 0


def test_engine_refusals_are_answers_with_their_code(engine):
    link = EngineLink(engine["router"])
    link.send("shape", [1.0, 2.0, 3.0])        # the model takes 2 inputs
    (a,) = drain(link, 1)
    link.close()
    assert a.error == "bad_shape" and a.pred is None and link.counts["refused:bad_shape"] == 1


def test_bridge_settings_come_from_the_serve_toml_and_name_bad_keys(tmp_path):
    from dataclasses import dataclass

    from streamtrace.adapters.bridge import engine_endpoint, load_bridge_config
    from streamtrace.engine.config import ConfigError, load_config

    @dataclass
    class Settings:
        qos: int = 0
        topic: str = "sensors/+/data"

    good = tmp_path / "good.toml"
    good.write_text('[sockets]\nrouter = "tcp://*:5999"\n[bridge.mqtt]\nqos = 1\n')
    load_config(good)                               # the engine accepts the file with a bridge section
    s, router = load_bridge_config(good, "mqtt", Settings())
    assert (s.qos, s.topic) == (1, "sensors/+/data")
    assert engine_endpoint(None, router) == "tcp://127.0.0.1:5999"   # bound -> connectable
    assert engine_endpoint("ipc:///tmp/x", router) == "ipc:///tmp/x"
    for body, key in (('[bridge.mqtt]\nqso = 1\n', "bridge.mqtt.qso"), ('[bridge.mqtt]\nqos = "one"\n', "bridge.mqtt.qos"),
                      ('bridge = 3\n', "bridge")):
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        with pytest.raises(ConfigError) as e:
            load_bridge_config(bad, "mqtt", Settings())
        assert e.value.key == key


def test_a_sample_refused_unread_does_not_cost_the_stream_its_numbering(engine):
    link = EngineLink(engine["router"])
    link.send("unread", [0.0, 0.0])
    link.send("unread", [1.0, 2.0, 3.0])       # bad_shape: the engine does not use seq 1
    for i in range(3):
        link.send("unread", [0.1 * i, 0.0])    # in flight behind it: refused as gaps (seq 2..4)
    first = sorted(drain(link, 5), key=lambda a: a.seq)    # refusals can overtake a prediction
    assert [a.error for a in first] == [None, "bad_shape", "gap", "gap", "gap"]
    assert link.next_seq["unread"] == 1 and link.counts["resynced"] == 1
    link.send("unread", [0.5, 0.5])
    (after,) = drain(link, 1)
    link.close()
    assert after.error is None and after.seq == 1


def test_with_no_engine_sending_never_blocks_and_counts_what_was_not_sent(tmp_path):
    link = EngineLink(f"ipc://{tmp_path}/nobody")
    seqs = [link.send("s", [0.0, 0.0]) for _ in range(3000)]   # default high-water mark is 1000
    link.close()
    sent = [s for s in seqs if s is not None]
    assert sent == list(range(len(sent))) and 0 < len(sent) < 3000
    assert link.counts["not_sent"] == 3000 - len(sent) and link.next_seq["s"] == len(sent)
