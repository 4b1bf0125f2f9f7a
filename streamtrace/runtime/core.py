"""The runner's answers to wire messages, without I/O: what ``streamtrace-runner`` does with each
message its sockets receive (``server.py`` is the ZeroMQ shell around it).

Each ``data`` message steps its stream's slot at once through the exported step program and is
answered with a ``prediction`` as ``serve`` answers it (the same fields, the same ``outlier`` /
``rolled_back`` flags); a bad message is refused with ``serve``'s error codes and changes no
state; ``get_weights`` is answered with a snapshot; ``label`` messages are refused (delayed
labels are not exported). Outputs are ``("reply", origin, bytes)`` and ``("pub", topic, bytes)``.
"""
from __future__ import annotations

import time

import numpy as np

from .. import wire
from ..checkpoints import CheckpointDir
from .streams import StreamTable

__all__ = ["RunnerCore"]

_COUNTED = {"outlier": "outliers", "rolled_back": "rolled_back"}     # a reply's flag -> its counter


class RunnerCore:
    """Message handling of an exported learner.

    Parameters
    ----------
    runner : Runner
        The exported learner (``streamtrace.runtime.runner.Runner``).
    max_message_bytes : int
        Larger messages are refused (``too_large``).
    publish_predictions : bool
        Also publish every prediction on ``pred/<stream>`` (with its signal, as ``serve``).
    checkpoint_dir : str
        Folder of numbered checkpoints (``""``: none), in ``serve``'s format: each resumes the
        other.
    checkpoint_every, keep : int
        A checkpoint every this many steps, the newest ``keep`` kept.
    weights_every : int
        Publish a weights update every this many steps (0: never).
    """

    def __init__(self, runner, *, max_message_bytes: int = wire.MAX_MESSAGE_BYTES, publish_predictions: bool = True,
                 checkpoint_dir: str = "", checkpoint_every: int = 1000, keep: int = 3, weights_every: int = 100,
                 clock=time.monotonic):
        self.runner, self.clock, self.max_bytes = runner, clock, max_message_bytes
        m = runner.manifest
        (xs, self.x_dtype), (ys, self.y_dtype) = ((tuple(a[0]), np.dtype(a[1])) for a in (m["inputs"]["x"],
                                                                                          m["inputs"]["y"]))
        self.x_shape, self.y_shape, self.n = xs[1:], ys[1:], xs[0]
        self.forecast = m.get("mode", "forecast") == "forecast"
        self.x, self.y = np.zeros(xs, self.x_dtype), np.zeros(ys, self.y_dtype)
        self.active, self.learn = np.zeros(self.n, bool), np.zeros(self.n, bool)
        self.table = StreamTable(self.n)
        self.encode = wire.PredictionEncoder()
        self.publish = publish_predictions
        self.version, self.weights_every, self._published = 0, weights_every, None
        self.ckpt = CheckpointDir(checkpoint_dir, keep) if checkpoint_dir else None
        self.checkpoint_every, self._since_ckpt, self._since_weights = checkpoint_every, 0, 0
        self.counters = dict.fromkeys(("received", "accepted", "answered", "errors", "dropped", "steps", "updates",
                                       "checkpoints", "outliers", "rolled_back", "weights_published"), 0)
        self.errors_by_code: dict[str, int] = {}
        self.stream_loss: dict[str, float] = {}
        self.latencies: list[float] = []

    # ---- messages ---------------------------------------------------------------------
    def handle(self, raw: bytes, origin=None, t_recv: float | None = None) -> list:
        """One message in; what to send out. Every message is counted: answered or refused."""
        t_recv = self.clock() if t_recv is None else t_recv
        self.counters["received"] += 1
        msg = None
        try:
            msg = wire.decode(raw, self.max_bytes)
            kind = msg["type"]
            if kind == "get_weights":
                if origin is None:
                    raise wire.WireError("bad_type", "get_weights is answered over request/reply (the ROUTER "
                                         "socket) only; fire-and-forget (PULL) has no way to answer")
                self.counters["answered"] += 1
                return [("reply", origin, self.weights_message("snapshot"))]
            if kind == "label":
                raise wire.WireError("bad_type", "label messages need learning.label_delay >= 1, which an "
                                     "exported learner does not take (targets come with their data messages)")
            if kind != "data":
                raise wire.WireError("bad_type", f"unknown message type {kind!r}; expected 'data', 'label' or "
                                     "'get_weights'")
            d = wire.decode_data(msg, self.x_shape, self.y_shape, self.x_dtype, self.y_dtype)
        except wire.WireError as e:
            stream, seq, extra = _named(msg), None, {}
            if stream is not None:
                stream, seq = stream
                expected = self.table.expected(stream)
                if expected is not None:
                    extra["expected"] = expected
            return self.refuse(origin, e.code, str(e), stream, seq, **extra)
        return self._data(d, origin, t_recv)

    def refuse(self, origin, code: str, message: str, stream=None, seq=None, **extra) -> list:
        """An ``error`` reply (and its publication), counted by code."""
        self.counters["errors"] += 1
        self.errors_by_code[code] = self.errors_by_code.get(code, 0) + 1
        if code in ("no_slot", "overloaded"):
            self.counters["dropped"] += 1
        err = {"type": "error", "code": code, "message": message, **extra}
        if stream is not None:
            err["stream"], err["seq"] = stream, seq
        raw = wire.encode(err)
        return [("pub", b"error", raw)] + ([("reply", origin, raw)] if origin is not None else [])

    def _data(self, d, origin, t_recv) -> list:
        name, seq = d["stream"], d["seq"]
        st = self.table.admit(name, seq)
        if isinstance(st, tuple):
            code, message, expected = st
            extra = {} if expected is None else {"expected": expected}
            return self.refuse(origin, code, message, name, seq, **extra)
        self.counters["accepted"] += 1
        pred, loss, events = self._step(st.slot, d)
        out = self._answer(d, origin, pred, loss, events)
        self.latencies.append(self.clock() - t_recv)
        del self.latencies[:-20000]
        return out + self._after_step()

    def _step(self, slot: int, d):
        """One step of ``slot`` alone (the others inactive): (prediction, loss or None, events)."""
        learns = d["mode"] == "learn" and (self.forecast or d["y"] is not None)
        self.x[slot], self.active[:], self.learn[:] = d["x"], False, False
        self.y[slot] = 0 if d["y"] is None else d["y"]
        self.active[slot], self.learn[slot] = True, learns
        pred, loss, applied = self.runner.step(self.x, self.y, self.active, self.learn)
        self.counters["steps"] += 1
        done = applied[slot] if np.ndim(applied) else applied
        self.counters["updates"] += int(bool(done))
        events = {k: True for k, flag in self.runner.events.items() if flag[slot]}
        for key in events:
            self.counters[_COUNTED[key]] += 1
        value = float(loss[slot])
        return np.array(pred[slot]), (None if value != value else value), events

    def _answer(self, d, origin, pred, loss, events) -> list:
        name, out = d["stream"], []
        if loss is not None:
            self.stream_loss[name] = loss
        args = (name, d["seq"], pred, loss, self.counters["steps"], self.version, d["ts"])
        if origin is not None:
            out.append(("reply", origin, self.encode(*args, events=events)))
        if self.publish:
            signal = d["x"] if d["y"] is None else d["y"]
            out.append(("pub", b"pred/" + name.encode(), self.encode(*args, signal, events=events)))
        self.counters["answered"] += 1
        return out

    def _after_step(self) -> list:
        self._since_ckpt += 1
        self._since_weights += 1
        if self.ckpt is not None and self._since_ckpt >= self.checkpoint_every:
            self.save_checkpoint()
        if self.weights_every and self._since_weights >= self.weights_every:
            return [("pub", b"weights", self.weights_message("update"))]
        return []

    # ---- what predicts ------------------------------------------------------------------
    def _arrays(self) -> dict:
        named, w = self.runner.state_dict(), self.runner.manifest["weights"]
        return {**{f"params.{p}": named[n] for p, n in w["params"].items()},
                **{f"state.{n}": named[n] for n in w["state"]}}

    def weights_message(self, kind: str) -> bytes:
        """A ``weights`` message as ``serve`` sends it: a snapshot of everything that predicts, or
        an update (a new version: the arrays that changed since the last publish)."""
        arrays, prev, base = self._arrays(), self._published, None
        changed = {n: v for n, v in arrays.items() if prev is None or not np.array_equal(prev.get(n), v)}
        if kind == "update" or changed:
            base, self.version = self.version, self.version + 1
            self._published, self._since_weights = arrays, 0
        if kind == "update":
            self.counters["weights_published"] += 1
            arrays = changed
        part = lambda prefix: {n[len(prefix):]: wire.pack_array(v) for n, v in arrays.items()  # noqa: E731
                               if n.startswith(prefix)}
        return wire.encode({"type": "weights", "kind": kind, "version": self.version,
                            "base": base if kind == "update" else None, "params": part("params."),
                            "state": part("state."), "streams": {n: s.slot for n, s in self.table.streams.items()}})

    def stats_message(self) -> bytes:
        """A ``stats`` publication: the counters, latency percentiles (microseconds), per-stream
        loss, streams and free slots."""
        lat = np.asarray(self.latencies) * 1e6
        pct = {k: float(np.percentile(lat, q)) for k, q in (("p50", 50), ("p90", 90), ("p99", 99))} if lat.size \
            else {}
        return wire.encode({"type": "stats", **self.counters, "errors_by_code": dict(self.errors_by_code),
                            "latency_us": {**pct, "max": float(lat.max())} if lat.size else {},
                            "stream_loss": dict(self.stream_loss), "streams": len(self.table.streams),
                            "slots_free": len(self.table.free), "lost_on_resync": self.table.lost_on_resync,
                            "version": self.version, "pending": 0, "runner": True,
                            "mode": "forecast" if self.forecast else "supervised"})

    # ---- durability ---------------------------------------------------------------------
    def save_checkpoint(self):
        """A numbered checkpoint in ``serve``'s format (state, steps, version, each stream's slot
        and next seq); None without a checkpoint folder."""
        if self.ckpt is None:
            return None
        extra = {"steps": self.counters["steps"], "version": self.version, "streams": self.table.to_extra()}
        path = self.ckpt.save(self.counters["steps"], self.runner.state_dict(), self.runner.manifest["signature"],
                              extra)
        self._since_ckpt = 0
        self.counters["checkpoints"] += 1
        return path

    def resume(self) -> dict | None:
        """Continue from the newest good checkpoint of the folder (``serve``'s or the runner's),
        if any; its header, or None."""
        if self.ckpt is None:
            return None
        path, arrays, header, _ = self.ckpt.latest_good(self.runner.manifest["signature"])
        if path is None:
            return None
        extra = header.get("extra", {})
        self.runner.load_arrays(arrays, int(extra.get("steps", 0)))
        self.counters["steps"], self.version = int(extra.get("steps", 0)), int(extra.get("version", 0))
        self.table.restore(extra.get("streams", {}))
        return {"path": str(path), **header}


def _named(msg):
    """(stream, seq) of a message when both can be read, else None."""
    if isinstance(msg, dict) and isinstance(msg.get("stream"), str) and isinstance(msg.get("seq"), int) \
            and not isinstance(msg.get("seq"), bool):
        return msg["stream"], msg["seq"]
    return None
