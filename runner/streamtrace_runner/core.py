"""The runner's server without sockets: the same messages and answers as ``serve``'s engine.

``ingest(raw, origin)`` checks one message and steps it at once (the runner has no queue),
returning ``("reply", origin, bytes)`` for the sender (origin None: fire-and-forget) and
``("pub", topic, bytes)`` for subscribers, as ``serve`` does: a prediction, a weights snapshot,
or an error with ``serve``'s code (wire.py's, and repeat, gap, no_slot, bad_type, internal).
A refused message changes no state. Streams get a slot each (a model per stream, bank.py;
streams.py: a slot idle for longer than ``idle_timeout_s`` is freed, its state parked for
``park_s``); the counters and the ``stats`` message are ``serve``'s (counters.py, stats.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import labels, wire
from .lazy_log import LazyLogger
from .reply_first import allowed as reply_first_allowed
from .checkpoints import CheckpointDir, position_extra, position_of
from .counters import EngineCounters
from .stats import stats_snapshot
from .streams import Refused, StreamTable
from .weights import WeightArrays, served
from .weights_frame import digests, encode_weights

__all__ = ["RunnerCore", "Options"]

log = LazyLogger("streamtrace.runner")


@dataclass
class Options:
    """The server's settings, named as ``serve``'s config keys (engine.*, checkpoint.*, publish.*)."""
    slots: int = 16
    idle_timeout_s: float = 60.0
    park_s: float = 3600.0
    max_parked: int = 256
    on_gap: str = "reject"
    max_message_bytes: int = 1 << 20
    checkpoint_dir: str = ""
    checkpoint_every: int = 1000
    checkpoint_keep: int = 3
    weights_every: int = 100
    stats_every_s: float = 1.0
    predictions: bool = True
    reply_first: bool = True     # answer from the prediction twin before the step, where allowed
    busy_poll_us: int = 5000     # poll without sleeping between messages this close (0: off; spin.py)


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
        self.label_delay = int(m.get("label_delay", 0))
        self.metrics = EngineCounters()
        self.table = StreamTable(bank, self.metrics, idle_timeout_s=options.idle_timeout_s, park_s=options.park_s,
                                 max_parked=options.max_parked, label_delay=self.label_delay, on_gap=options.on_gap)
        self.steps = self.version = self._since_ckpt = self._since_publish = 0
        self.weights = WeightArrays(bank)
        self._reply = wire.PredictionEncoder()
        self.ckpt = CheckpointDir(options.checkpoint_dir, options.checkpoint_keep) if options.checkpoint_dir else None
        # reply first (serve's engine.reply_first): where the prediction does not depend on the
        # step's update and the folder has the prediction twin, a data message given a sender
        # is answered from the twin and stepped after its reply has left (reply_first.py)
        self.reply_first = options.reply_first and reply_first_allowed(m["config"]["learning"]) and \
            "predict" in m.get("programs", {})
        self.replied_first = False       # the last message's replies went before its step

    # the parts' state, under the names the server and the tests know
    streams = property(lambda self: self.table.streams)
    free = property(lambda self: self.table.free)
    parking = property(lambda self: self.table.parking)
    counters = property(lambda self: self.metrics.counters)
    errors = property(lambda self: self.metrics.errors_by_code)

    def ingest(self, raw: bytes, origin=None, send=None) -> list:
        """One message in; what to send out. Any failure is a refusal (``internal``). ``send``:
        a sender a data message's replies may go to before its step runs (``reply_first``),
        which the server passes when nothing else waits on its sockets."""
        self.metrics.count("received")
        self.replied_first = False
        try:
            return self._ingest(raw, origin, self.clock(), send)
        except Exception as e:  # noqa: BLE001 - one message must never stop the server
            log.exception("internal error while handling one message (refused as 'internal')")
            return self._refuse(origin, "internal", f"the runner failed to handle this message "
                                f"({type(e).__name__}); it was refused and nothing was learned from it", None, None)

    def has_pending(self) -> bool:
        """False: a message steps at ``ingest`` (``EngineCore``'s interface, whose steps queue)."""
        return False

    def reject(self, origin, code: str, message: str) -> list:
        """A message refused before its payload could be read (its framing)."""
        self.metrics.count("received")
        return self._refuse(origin, code, message, None, None)

    def _ingest(self, raw, origin, t_recv, send) -> list:
        msg = None
        try:
            msg = wire.decode(raw, self.opt.max_message_bytes)
            kind = msg["type"]
            if kind == "get_weights":
                if origin is None:
                    raise wire.WireError("bad_type", "get_weights is answered over request/reply (the ROUTER "
                                         "socket) only; fire-and-forget (PULL) has no way to answer")
                reply = self.weights_message("snapshot")
                self.metrics.count("answered")
                return [("reply", origin, reply)]
            if kind == "label":
                return self._label(wire.decode_label(msg, self.y_shape, self.y_dtype), origin)
            if kind != "data":
                raise wire.WireError("bad_type", f"unknown message type {kind!r}; expected 'data', 'label' "
                                     "or 'get_weights'")
            data = wire.decode_data(msg, self.x_shape, self.y_shape, self.x_dtype, self.y_dtype)
        except wire.WireError as e:
            stream, seq, extra = None, None, {}
            if msg is not None and isinstance(msg.get("stream"), str) and type(msg.get("seq")) is int:
                stream, seq = msg["stream"], msg["seq"]
                expected = self.table.expected(stream, t_recv)
                if expected is not None:
                    extra["expected"] = expected
            return self._refuse(origin, e.code, str(e), stream, seq, **extra)
        return self._accept(data, origin, t_recv, send)

    def _refuse(self, origin, code, message, stream, seq, **extra) -> list:
        self.metrics.error(code)
        if code == "no_slot":
            self.metrics.count("dropped")
        err = {"type": "error", "code": code, "message": message, **extra}
        if stream is not None:
            err["stream"], err["seq"] = stream, seq
        raw = wire.encode(err)
        return [("pub", b"error", raw)] + ([("reply", origin, raw)] if origin is not None else [])

    def _accept(self, d, origin, t_recv, send) -> list:
        name, seq = d["stream"], d["seq"]
        try:
            self.table.check(name, seq, t_recv)
        except Refused as e:
            return self._refuse(origin, e.code, str(e), name, seq, **e.extra)
        st = self.table.admit(name, seq, t_recv)
        if st is None:
            return self._refuse(origin, "no_slot", f"all {self.bank.n} slots are busy; stream '{name}' was "
                                "not admitted (raise --slots or wait for idle streams)", name, seq)
        self.metrics.count("accepted")
        own_label = st.recent is not None and d["y"] is not None and d["mode"] == "learn"
        # (a step with its own delayed label answers after it, as serve's, which runs it
        # through the label's path, not the loop's reply-first one)
        out = self._step(st, d, origin, t_recv, None if own_label else send)
        if st.recent is not None:
            st.recent.append(seq)
            if own_label:        # its own label, applied at once
                out += self._apply_label(st, name, 0, d["y"], origin, seq, ack=False)
        return out

    # ---- delayed labels (learning.label_delay) ----------------------------------------
    def _label(self, lab, origin) -> list:
        """A ``label`` message, as ``serve`` answers it: a ``label_ack`` or unknown_label,
        label_too_late, already_labelled (nothing changes)."""
        name, seq = lab["stream"], lab["seq"]
        if not self.label_delay:
            return self._refuse(origin, "bad_type", "label messages need learning.label_delay >= 1 (this "
                                "runner takes targets with their data messages only)", name, seq)
        st = self.streams.get(name)
        if st is None:
            return self._refuse(origin, "unknown_label", f"stream '{name}' holds no slot (unknown, idle or "
                                "parked): its labels cannot be applied", name, seq)
        age, refused = labels.age_of(st.recent, seq, name)
        if refused:
            return self._refuse(origin, *refused, name, seq)
        return self._apply_label(st, name, age, lab["y"], origin, seq, ack=True)

    def _apply_label(self, st, name, age, y, origin, seq, ack: bool) -> list:
        status, loss, applied = self.bank.label(st.slot, y, age)
        if status:
            if not ack:      # the data message was answered; its y could not be learned from
                self.metrics.count("labels_refused")
                return []
            return self._refuse(origin, *labels.refusal(status, name, seq, age), name, seq)
        self.metrics.count("labels")
        self.metrics.count("updates", int(applied))
        self.metrics.loss(name, loss)
        if not ack:
            return []
        self.metrics.count("answered")
        if origin is None:
            return []
        return [("reply", origin, wire.encode({"type": "label_ack", "stream": name, "seq": seq,
                                               "loss": loss, "applied": applied}))]

    def _step(self, st, d, origin, t_recv, send) -> list:
        if self.ckpt and self._since_ckpt >= self.opt.checkpoint_every:
            self.save_checkpoint()
        learns = d["mode"] == "learn" and (not self.supervised or d["y"] is not None or st.recent is not None)
        y = d["y"] if self.supervised else None
        bank = self.bank
        early = self.replied_first = send is not None and self.reply_first
        if early:        # the twin's answer (the step's prediction and loss), sent before the step
            prediction, loss, _ = bank.predict(st.slot, d["x"], y, learns)
            send(self._answers(d, origin, t_recv, prediction, loss, bank.runner.twin_events, self.steps + 1))
            self.metrics.count("replied_first")
        prediction, loss, applied = bank.step(st.slot, d["x"], y, learns)
        self.steps += 1
        self._since_ckpt += 1
        self._since_publish += 1
        self.metrics.count("steps")
        self.metrics.count("updates", int(np.any(applied)))
        out = [] if early else self._answers(d, origin, t_recv, prediction, loss, bank.runner.events, self.steps)
        if self.opt.weights_every and self._since_publish >= self.opt.weights_every:
            out.append(("pub", b"weights", self.weights_message("update")))
        return out

    def _answers(self, d, origin, t_recv, prediction, loss, events, steps) -> list:
        """The reply and publication of the data message ``d`` from its step's (or the twin's)
        prediction, loss and per-slot ``events``, counted as ``serve`` counts them."""
        m, name = self.metrics, d["stream"]
        events = {k: True for k, v in events.items() if v[0]} or None
        if events:
            m.events(name, events)
        loss = float(loss[0])
        m.loss(name, loss)
        args = (name, d["seq"], prediction[0], None if loss != loss else loss, steps, self.version, d["ts"])
        out = []
        if self.opt.predictions:
            signal = d["x"] if d["y"] is None else d["y"]
            out.append(("pub", b"pred/" + name.encode(), self._reply(*args, signal, events=events)))
        if origin is not None:
            out.append(("reply", origin, self._reply(*args, events=events)))
        m.latency(self.clock() - t_recv)
        m.count("answered")
        return out

    def evict_idle(self, now: float | None = None):
        """Free the slots of streams idle for longer than ``idle_timeout_s``, parking their state."""
        self.table.evict_idle(self.clock() if now is None else now)

    # ---- weights, stats ------------------------------------------------------------------
    def weights_message(self, kind: str) -> bytes:
        """As ``serve``: 'snapshot' (everything that predicts, a new version if it moved since the
        last publish) or 'update' (a new version, the arrays that changed; weights.py), the rows of
        the slots serving a stream (``weights.served``), written slot by slot into the one buffer
        sent (weights_frame.py)."""
        w = self.weights
        slots, rows = served({name: st.slot for name, st in self.streams.items()})
        names = w.chosen(slots, skip_fixed=kind == "update")
        got = digests(self.bank, names, slots)
        changed, base = w.changed(got, slots), None
        if kind == "update" or changed:
            base = self.version if kind == "update" else None
            self.version += 1
            w.remember(got, slots)
            self._since_publish = 0
        if kind == "update":
            self.metrics.count("weights_published")
            names = {n: names[n] for n in changed}
        part = lambda prefix: {n[len(prefix):]: k for n, k in names.items() if n.startswith(prefix)}
        return encode_weights({"type": "weights", "kind": kind, "version": self.version, "base": base,
                               "params": None, "state": None, "slots": slots, "streams": rows},
                              {"params": part("params."), "state": part("state.")}, self.bank, slots)

    def stats_message(self) -> bytes:
        """``serve``'s stats (stats.py): its counters, latency percentiles, per-stream loss,
        events and rolling metrics, the learner's counters, streams, slots_free, parked_streams,
        version; and ``runner: true``."""
        return wire.encode({"type": "stats", **stats_snapshot(self), "runner": True})

    # ---- durability ----------------------------------------------------------------------
    def save_checkpoint(self):
        """The bank's state in ``serve``'s checkpoint format and folder layout (``ckpt-<step>.npz``)."""
        if not self.ckpt:
            return None
        extra = position_extra(self.steps, self.version, self.table.positions())
        path = self.ckpt.save(self.steps, self.bank.state_dict(), self.bank.signature(), extra)
        self._since_ckpt = 0
        self.metrics.count("checkpoints")
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
        self.steps, self.version, streams = position_of(header)
        self.table.restore(streams, self.clock())
        self.weights.published = None
        return {"path": str(path), **header}
