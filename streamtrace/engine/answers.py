"""A tick's answers: the replies and publications of its steps, from their results.

Each step's reply goes to its sender (origin None: fire-and-forget, no reply) and, with
``publish.predictions``, to the subscribers of ``pred/<stream>`` (with ``publish.signal``
carrying what was measured too); its loss, flags and latency are counted per stream.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Answers"]


class Answers:
    """The replies of a tick's steps.

    Parameters
    ----------
    encode : wire.PredictionEncoder
        A prediction reply's bytes.
    metrics : EngineCounters
        Where losses, events, latencies and answers are counted.
    publish : EngineConfig.publish
        ``predictions`` and ``signal``.
    clock : callable
        Now, in seconds (a reply's latency since its message came).

    >>> from types import SimpleNamespace as NS
    >>> from streamtrace.engine.counters import EngineCounters
    >>> answers = Answers(None, EngineCounters(), NS(predictions=False, signal=False), clock=lambda: 0.0)
    >>> answers([], [], steps=0, version=0)
    []
    """

    def __init__(self, encode, metrics, publish, clock):
        self.encode, self.metrics, self.publish, self.clock = encode, metrics, publish, clock

    def __call__(self, taken, results, steps: int, version: int) -> list:
        """The replies and publications of the steps ``taken`` (result index, position,
        message, origin, t_recv) from their ``results``."""
        encode, metrics, publish = self.encode, self.metrics, self.publish.predictions
        signal = publish and self.publish.signal
        out, now = [], self.clock()
        for j, p, d, origin, t_recv in taken:
            r = results[j]
            loss = float(r.loss[p])
            name = d["stream"]
            metrics.loss(name, loss)
            args = (name, d["seq"], r.prediction[p], None if loss != loss else loss, steps, version, d["ts"])
            events = _events(r, p)
            if events:
                metrics.events(name, events)
            reply = encode(*args, events=events) if origin is not None or (publish and not signal) else None
            if origin is not None:
                out.append(("reply", origin, reply))
            if publish:
                if signal:     # the published copy also carries what was measured (dashboards)
                    reply = encode(*args, d["x"] if d["y"] is None else d["y"], events=events)
                out.append(("pub", b"pred/" + name.encode(), reply))
            metrics.latency(now - t_recv)
        metrics.count("answered", len(taken))
        return out


def _events(r, p) -> dict | None:
    """What happened to slot ``p``'s step besides its answer (the reply's flags), or None."""
    got = {}
    for key in ("outlier", "rolled_back"):
        v = getattr(r, key)
        if bool(v[p] if isinstance(v, np.ndarray) else v):
            got[key] = True
    return got or None
