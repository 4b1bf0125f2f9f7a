"""serve's stats message carries each stream's seasons (``stream_seasons``), against a series whose
season is known by construction."""
import numpy as np

from streamtrace import wire
from streamtrace.engine import EngineCore, load_config


def test_serves_stats_message_carries_each_streams_seasons():
    cfg = load_config(None, {"model": {"stack": "gru", "n_hidden": 4, "n_in": 1, "n_out": 1},
                             "learning": {"mode": "forecast"}, "combine": {"experts": True, "max_period": 16},
                             "engine": {"slots": 2, "park_s": 0}, "publish": {"weights_every": 0}})
    core = EngineCore(cfg)
    for seq, x in enumerate(_wave(160, 7)):
        core.ingest(wire.data_message("s", seq, np.array([x], np.float32)), b"o")
        core.tick(None)
    stats = wire.decode(core.stats_message())
    assert stats["stream_seasons"] == {"s": [[7, 0]]}
    assert "seasons" not in stats["learner"]


def _wave(T, period):
    t = np.arange(T)
    return (np.sin(2 * np.pi * t / period) + 0.05 * np.random.default_rng(0).standard_normal(T)).astype(np.float32)
