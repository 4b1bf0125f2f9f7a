"""The runner's server without sockets: the same messages and answers as ``serve``'s engine.

``ingest(raw, origin)`` checks one message and steps it at once (the runner has no queue),
returning ``("reply", origin, bytes)`` for the sender (origin None: fire-and-forget) and
``("pub", topic, bytes)`` for subscribers, as ``serve`` does: a prediction, a weights snapshot,
or an error with ``serve``'s code (wire.py's, and repeat, gap, no_slot, bad_type, internal).
A refused message changes no state. Streams get a slot each (a model per stream, bank.py);
a slot idle for longer than ``idle_timeout_s`` is freed for a new stream (reset on reuse).
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from . import wire
from .checkpoints import CheckpointDir

__all__ = ["RunnerCore", "Options"]

log = logging.getLogger("streamtrace.runner")


@dataclass
class Options:
    """The server's settings, named as ``serve``'s config keys (engine.*, checkpoint.*, publish.*)."""
    slots: int = 16
    idle_timeout_s: float = 60.0
    on_gap: str = "reject"
    max_message_bytes: int = 1 << 20
    checkpoint_dir: str = ""
    checkpoint_every: int = 1000
    checkpoint_keep: int = 3
    weights_every: int = 100
    stats_every_s: float = 1.0
    predictions: bool = True


@dataclass
class Stream:
    slot: int
    next_seq: int | None = None
    last_seen: float = 0.0
    resync: bool = False               # restored from a checkpoint: may jump forward once


class RunnerCore:
    """Messages in, answers out, over a ``bank.RunnerBank``.

    >>> import tempfile
    >>> from streamtrace.export.write import export_learner     # (where streamtrace is installed)
    >>> from streamtrace_runner.runtime import Runner
    >>> from streamtrace_runner.bank import RunnerBank
    >>> folder = tempfile.mkdtemp(); _ = export_learner(None, folder)
    >>> core = RunnerCore(RunnerBank(Runner(folder), 2), Options(slots=2))
    >>> out = core.ingest(wire.data_message("s", 0, np.array([0.5])), b"me")
    >>> [(kind, wire.decode(raw)["type"]) for kind, _, raw in out]
    [('pub', 'prediction'), ('reply', 'prediction')]
    """

    def __init__(self, bank, options: Options, clock=time.monotonic):
        self.bank, self.opt, self.clock = bank, options, clock
        m = bank.runner.manifest
        self.x_shape, self.x_dtype = tuple(m["inputs"]["x"][0][1:]), np.dtype(m["inputs"]["x"][1])
        self.y_shape, self.y_dtype = tuple(m["inputs"]["y"][0][1:]), np.dtype(m["inputs"]["y"][1])
        self.supervised = m["config"]["learning"]["mode"] == "supervised"
        self.streams: dict[str, Stream] = {}
        self.free = list(range(bank.n - 1, -1, -1))
        self.unused = set(self.free)
        self.counters, self.errors = Counter(), Counter()
        self.steps = self.version = self._since_ckpt = self._since_publish = 0
        self._published = None
        self._reply = wire.PredictionEncoder()
        self.ckpt = CheckpointDir(options.checkpoint_dir, options.checkpoint_keep) if options.checkpoint_dir else None

    def ingest(self, raw: bytes, origin=None) -> list:
        """One message in; what to send out. Any failure is a refusal (``internal``)."""
        self.counters["received"] += 1
        try:
            return self._ingest(raw, origin)
        except Exception as e:  # noqa: BLE001 - one message must never stop the server
            log.exception("internal error while handling one message (refused as 'internal')")
            return self._refuse(origin, "internal", f"the runner failed to handle this message "
                                f"({type(e).__name__}); it was refused and nothing was learned from it", None, None)

    def has_pending(self) -> bool:
        """False: a message steps at ``ingest`` (``EngineCore``'s interface, whose steps queue)."""
        return False

    def reject(self, origin, code: str, message: str) -> list:
        """A message refused before its payload could be read (its framing)."""
        self.counters["received"] += 1
        return self._refuse(origin, code, message, None, None)

    def _ingest(self, raw, origin) -> list:
        msg = None
        try:
            msg = wire.decode(raw, self.opt.max_message_bytes)
            kind = msg["type"]
            if kind == "get_weights":
                if origin is None:
                    raise wire.WireError("bad_type", "get_weights is answered over request/reply (the ROUTER "
                                         "socket) only; fire-and-forget (PULL) has no way to answer")
                self.counters["answered"] += 1
                return [("reply", origin, self.weights_message("snapshot"))]
            if kind == "label":
                label = wire.decode_label(msg, self.y_shape, self.y_dtype)
                return self._refuse(origin, "bad_type", "label messages need learning.label_delay >= 1 (this "
                                    "runner takes targets with their data messages only)", label["stream"], label["seq"])
            if kind != "data":
                raise wire.WireError("bad_type", f"unknown message type {kind!r}; expected 'data', 'label' "
                                     "or 'get_weights'")
            data = wire.decode_data(msg, self.x_shape, self.y_shape, self.x_dtype, self.y_dtype)
        except wire.WireError as e:
            stream, seq, extra = None, None, {}
            if msg is not None and isinstance(msg.get("stream"), str) and type(msg.get("seq")) is int:
                stream, seq = msg["stream"], msg["seq"]
                known = self.streams.get(stream)
                if known is not None and known.next_seq is not None:
                    extra["expected"] = known.next_seq
            return self._refuse(origin, e.code, str(e), stream, seq, **extra)
        return self._accept(data, origin)

    def _refuse(self, origin, code, message, stream, seq, **extra) -> list:
        self.counters["errors"] += 1
        self.errors[code] += 1
        if code == "no_slot":
            self.counters["dropped"] += 1
        err = {"type": "error", "code": code, "message": message, **extra}
        if stream is not None:
            err["stream"], err["seq"] = stream, seq
        raw = wire.encode(err)
        return [("pub", b"error", raw)] + ([("reply", origin, raw)] if origin is not None else [])

    def _accept(self, d, origin) -> list:
        name, seq, now = d["stream"], d["seq"], self.clock()
        st = self.streams.get(name)
        expected = None if st is None else st.next_seq
        if expected is not None and seq != expected:
            if seq < expected:
                return self._refuse(origin, "repeat", f"stream '{name}': seq {seq} was already received "
                                    f"(expected {expected})", name, seq, expected=expected)
            if not st.resync and self.opt.on_gap == "reject":
                return self._refuse(origin, "gap", f"stream '{name}': seq {seq} skips ahead (expected "
                                    f"{expected}); resend from {expected}", name, seq, expected=expected)
        if st is None:
            slot = self._take_slot(now)
            if slot is None:
                return self._refuse(origin, "no_slot", f"all {self.bank.n} slots are busy; stream '{name}' was "
                                    "not admitted (raise --slots or wait for idle streams)", name, seq)
            st = self.streams[name] = Stream(slot)
        if expected is not None and seq > expected:
            self.counters["lost_on_resync"] += seq - expected
        st.next_seq, st.resync, st.last_seen = seq + 1, False, now
        self.counters["accepted"] += 1
        return self._step(st, d, origin)

    def _step(self, st, d, origin) -> list:
        if self.ckpt and self._since_ckpt >= self.opt.checkpoint_every:
            self.save_checkpoint()
        learns = d["mode"] == "learn" and (not self.supervised or d["y"] is not None)
        y = d["y"] if self.supervised else None
        prediction, loss, applied = self.bank.step(st.slot, d["x"], y, learns)
        self.steps += 1
        self._since_ckpt += 1
        self._since_publish += 1
        self.counters["steps"] += 1
        self.counters["updates"] += int(np.any(applied))
        self.counters["answered"] += 1
        events = {k: True for k, v in self.bank.runner.events.items() if v[0]} or None
        loss = float(loss[0])
        args = (d["stream"], d["seq"], prediction[0], None if loss != loss else loss, self.steps, self.version, d["ts"])
        out = []
        if self.opt.predictions:
            signal = d["x"] if d["y"] is None else d["y"]
            out.append(("pub", b"pred/" + d["stream"].encode(), self._reply(*args, signal, events=events)))
        if origin is not None:
            out.append(("reply", origin, self._reply(*args, events=events)))
        if self.opt.weights_every and self._since_publish >= self.opt.weights_every:
            out.append(("pub", b"weights", self.weights_message("update")))
        return out

    def _take_slot(self, now):
        if not self.free:
            self.evict_idle(now)
        if not self.free:
            return None
        slot = self.free.pop()
        if slot not in self.unused:
            self.bank.reset(slot)
        self.unused.discard(slot)
        return slot

    def evict_idle(self, now: float | None = None):
        """Free the slots of streams idle for longer than ``idle_timeout_s``."""
        now = self.clock() if now is None else now
        for name, st in list(self.streams.items()):
            if now - st.last_seen > self.opt.idle_timeout_s:
                del self.streams[name]
                self.free.append(st.slot)

    # ---- weights, stats ------------------------------------------------------------------
    def _weight_arrays(self) -> dict:
        """{"params.<name>" | "state.<name>": array, slots first}: the manifest's ``weights`` map
        (the learner's ``params`` and ``predictor_state`` names -> checkpoint names)."""
        where = self.bank.runner.manifest.get("weights", {"params": {}, "state": {}})
        state = self.bank.state_dict({*where["params"].values(), *where["state"].values()})
        return {**{f"params.{n}": state[k] for n, k in where["params"].items()},
                **{f"state.{n}": state[k] for n, k in where["state"].items()}}

    def weights_message(self, kind: str) -> bytes:
        """As ``serve``: 'snapshot' (everything that predicts, a new version if it moved since the
        last publish) or 'update' (a new version, the arrays that changed)."""
        arrays, prev, base = self._weight_arrays(), self._published, None
        moved = prev is None or any(not np.array_equal(prev.get(n), v) for n, v in arrays.items())
        if kind == "update" or moved:
            base = self.version if kind == "update" else None
            self.version += 1
            self._published, self._since_publish = arrays, 0
        if kind == "update":
            self.counters["weights_published"] += 1
            arrays = {n: v for n, v in arrays.items() if prev is None or not np.array_equal(prev.get(n), v)}
        part = lambda prefix: {n[len(prefix):]: wire.pack_array(v) for n, v in arrays.items() if n.startswith(prefix)}
        return wire.encode({"type": "weights", "kind": kind, "version": self.version, "base": base,
                            "params": part("params."), "state": part("state."),
                            "streams": {name: st.slot for name, st in self.streams.items()}})

    def stats_message(self) -> bytes:
        """The counters ``serve``'s stats carry that the runner keeps (received, accepted, answered,
        errors, errors_by_code, steps, updates, ...), streams, slots_free, version."""
        return wire.encode({"type": "stats", **self.counters, "errors_by_code": dict(self.errors),
                            "streams": len(self.streams), "slots_free": len(self.free),
                            "version": self.version, "pending": 0, "runner": True})

    # ---- durability ----------------------------------------------------------------------
    def save_checkpoint(self):
        """The bank's state in ``serve``'s checkpoint format and folder layout (``ckpt-<step>.npz``)."""
        if not self.ckpt:
            return None
        extra = {"steps": self.steps, "version": self.version,
                 "streams": {n: {"slot": s.slot, "next_seq": s.next_seq} for n, s in self.streams.items()}}
        path = self.ckpt.save(self.steps, self.bank.state_dict(), self.bank.signature(), extra)
        self._since_ckpt = 0
        self.counters["checkpoints"] += 1
        return path

    def resume(self) -> dict | None:
        """Load the newest good checkpoint of the folder (``serve``'s or the runner's), if any;
        one of another learner raises ``CheckpointError``. Returns its header or None."""
        if not self.ckpt:
            return None
        path, arrays, header, _ = self.ckpt.latest_good(self.bank.signature())
        if path is None:
            return None
        self.bank.load_state_dict(arrays)
        extra = header.get("extra", {})
        self.steps, self.version = int(extra.get("steps", 0)), int(extra.get("version", 0))
        self.streams = {name: Stream(int(s["slot"]), s["next_seq"], self.clock(), resync=True)
                        for name, s in extra.get("streams", {}).items()}
        used = {st.slot for st in self.streams.values()}
        self.free = [i for i in range(self.bank.n - 1, -1, -1) if i not in used]
        self.unused = set()
        return {"path": str(path), **header}
