"""The engine without sockets: validate, route streams to slots, batch, step, answer.

``ingest(raw, origin)`` checks one message and queues it (or answers with an error at once);
``tick()`` runs every queued step in one compiled call and returns what to send. Outputs are
``("reply", origin, bytes)`` for the sender (origin None: fire-and-forget) and
``("pub", topic, bytes)`` for subscribers. No learner state changes for a refused message,
and any failure while handling one message is a refusal (code ``internal``), never a crash.
Streams evicted for being idle are parked (``parking.py``) and resume if they return in time.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .. import wire
from ..learner.bank import SlotBank
from ..learner.checkpoint import CheckpointDir
from ..learner.labels import LabelError
from ..recipe.build import build_learner
from .ticks import Ticks
from .config import EngineConfig
from .counters import EngineCounters
from .parking import ParkingLot

__all__ = ["EngineCore", "Stream", "subset_sizes"]

log = logging.getLogger("streamtrace.engine")

# a refused label in its stream's terms (the learner counts steps back in a slot, which users never see)
LABEL_REFUSALS = {"unknown_label": "data message seq {seq} left nothing to label (it did not learn: "
                                   "mode 'predict', or a step that was skipped)",
                  "already_labelled": "seq {seq} was already labelled"}


def subset_sizes(slots: int) -> list[int]:
    """Busy-slot counts with a call of their own (see EngineCore): 2 <= m <= slots / 4."""
    return [1 << i for i in range(1, slots.bit_length()) if 4 << i <= slots]


@dataclass
class Stream:
    slot: int
    next_seq: int | None = None       # None: the next message sets the base
    last_seen: float = 0.0
    resync: bool = False               # restored from a checkpoint: may jump forward once
    pending: deque = field(default_factory=deque)
    recent: deque | None = None        # learning.label_delay: the seqs of its last data messages


class EngineCore(Ticks):
    def __init__(self, cfg: EngineConfig, clock=time.monotonic):
        self.cfg, self.clock = cfg, clock
        ec = cfg.engine
        # a model per stream: a bank of one-slot states, all stepped by one program (each
        # stream's bits its own, a lone stream at a one-slot step's cost: learner/bank.py)
        self.banked = not ec.shared_weights
        self.learner = SlotBank(lambda n: build_learner(cfg, slots=n, shared_weights=False), ec.slots) \
            if self.banked else build_learner(cfg, slots=ec.slots, shared_weights=True)
        self.x_shape = self.learner.x_shape
        self.y_shape = self.learner.out_shape
        if self.x_shape != (cfg.model.n_in,):
            raise ValueError(f"model input shape {self.x_shape} does not match model.n_in = {cfg.model.n_in}")
        if self.y_shape != (cfg.model.n_out,):
            raise ValueError(f"model output shape {self.y_shape} does not match model.n_out = {cfg.model.n_out}; "
                             "set model.n_out to the model's output size")
        self.streams: dict[str, Stream] = {}
        self.free = list(range(ec.slots - 1, -1, -1))
        # slots no stream has used: their state is still the initial one (but for the learner's
        # count of calls, a statistic), so taking one needs no reset
        self.unused = set(self.free)
        self.metrics = EngineCounters()
        self.parking = ParkingLot(ec.park_s, ec.max_parked)
        self._internal_logged: set = set()
        self.version = 0                 # weights version (bumped at every publish)
        self.steps = 0                   # accepted data messages processed
        self._since_publish = 0
        self._since_ckpt = 0
        self._published_params: dict | None = None
        self.ckpt = CheckpointDir(cfg.checkpoint.dir, cfg.checkpoint.keep) if cfg.checkpoint.dir else None
        self._input_cache: dict = {}
        self._pending = 0                # queued messages over all streams (has_pending, per loop turn)
        self._reply = wire.PredictionEncoder()
        # shared weights: a call with few busy streams steps only their slots: programs for
        # 2 <= m <= slots / 4 busy slots (powers of two), each taking up to micro_batch steps
        # per slot. Gathering and writing back makes a slot cost ~1.6x its share of the full
        # step (measured, GRU-64 / 256 D-RTRL), and each program holds ~12 MB of code: larger
        # subsets gain too little. (A slot bank steps each busy slot alone: no subsets.)
        self.subsets = subset_sizes(self.learner.n) if self.learner.slots and not self.banked else []
        self.ready_subsets = list(self.subsets)
        # With subset programs (loops), a call over all slots is a loop too (up to micro_batch
        # steps, their number given at run time: one program for any burst); without them,
        # one program, the one-step one, and a burst takes one call per step.
        self.looped = bool(self.subsets)
        self.ready = [ec.micro_batch] if self.looped else [1]   # steps one call over all slots takes
        # reply first: where a prediction does not depend on its step's update, a one-step
        # call's replies may leave after a prediction program, before the step runs (tick)
        lc = cfg.learning
        self.reply_first = ec.reply_first and (lc.mode == "supervised" or lc.forecast_before_update)
        self.replied_first = False       # the last tick sent its replies before its update

    def warmup(self):
        """Compile every program now, so no message waits for the compiler."""
        self.warmup_first()
        for _ in self.warmup_later():
            pass

    def warmup_first(self):
        """The program over all slots: what the first answers need (a slot no stream has used
        needs no reset). The subset and slot programs wait for ``warmup_later``."""
        self.ready_subsets = []
        if self.looped:
            self.learner.programs.loop(self.cfg.engine.micro_batch)
        else:
            self.learner.programs.step()

    def warmup_later(self):
        """The other programs, one per ``next()``: the prediction program (reply_first), the
        subset calls (a few busy streams) with theirs, then
        the label program (learning.label_delay), the slot reset and parking's read and write
        (a stream leaving or coming back).
        ``tick`` uses a subset program once it is ready; a slot program needed before that is
        compiled on first use. Compiling never touches the state (the engine runs this on a
        thread of its own while serving)."""
        L = self.learner
        if self.reply_first:        # the prediction program of the call over all slots
            L.programs.predict(self._predict_key(None))
            yield
        for m in self.subsets:
            if m not in self.ready_subsets:
                L.programs.subset(m, self.cfg.engine.micro_batch)
                if self.reply_first:     # its prediction twin before it serves (tick asks for both)
                    L.programs.predict(self._predict_key(m))
                self.ready_subsets.append(m)
                yield
        if L.label_delay:
            L.programs.label()
            yield
        if L.slots is not None:
            if not self.banked:      # a bank resets a slot with a copy of its first state
                L.programs.reset()
                yield
            if self.parking.enabled:
                L.programs.read_slot()
                L.programs.write_slot()
                yield

    # ---- ingest -----------------------------------------------------------------------
    def ingest(self, raw: bytes, origin=None, t_recv: float | None = None) -> list:
        """One message in; every message is accounted for: it is queued (``accepted``, later
        ``answered``), answered at once (a weights snapshot: ``answered``) or refused (``errors``)."""
        t_recv = self.clock() if t_recv is None else t_recv
        self.metrics.count("received")
        try:
            return self._ingest(raw, origin, t_recv)
        except Exception as e:  # one message must never stop the engine
            key = type(e).__name__
            if key not in self._internal_logged:   # a traceback per kind of failure, not per message
                self._internal_logged.add(key)
                log.exception("internal error while handling one message (refused as 'internal')")
            return self._refuse(origin, "internal", f"the engine failed to handle this message ({key}); "
                                "it was refused and nothing was learned from it", None, None)

    def reject(self, origin, code: str, message: str) -> list:
        """A message refused before its payload could be read (its framing), counted like any other."""
        self.metrics.count("received")
        return self._refuse(origin, code, message, None, None)

    def _ingest(self, raw, origin, t_recv) -> list:
        msg = None
        try:
            msg = wire.decode(raw, self.cfg.engine.max_message_bytes)
            kind = msg["type"]
            if kind == "get_weights":
                if origin is None:
                    raise wire.WireError("bad_type", "get_weights is answered over request/reply (the ROUTER "
                                         "socket) only; fire-and-forget (PULL) has no way to answer")
                reply = self.weights_message("snapshot")
                self.metrics.count("answered")
                return [("reply", origin, reply)]
            if kind == "label":
                label = wire.decode_label(msg, self.y_shape, self.learner.y_dtype)
            elif kind != "data":
                raise wire.WireError("bad_type", f"unknown message type {kind!r}; expected 'data', 'label' "
                                     "or 'get_weights'")
            else:
                data = wire.decode_data(msg, self.x_shape, self.y_shape, self.learner.x_dtype, self.learner.y_dtype)
        except wire.WireError as e:
            # name the stream and seq when they can be read, and where the stream stands, so
            # a client can go on (a refused message uses up no sequence number)
            stream, seq, extra = None, None, {}
            if msg is not None and isinstance(msg.get("stream"), str) and isinstance(msg.get("seq"), int) \
                    and not isinstance(msg.get("seq"), bool):
                stream, seq = msg["stream"], msg["seq"]
                expected = self._expected(stream, t_recv)
                if expected is not None:
                    extra["expected"] = expected
            return self._refuse(origin, e.code, str(e), stream, seq, **extra)
        if kind == "label":
            return self._label(label, origin)
        return self._accept(data, origin, t_recv)

    def _expected(self, name, now):
        known = self.streams.get(name)
        if known is not None:
            return known.next_seq
        parked = self.parking.get(name, now) if self.parking.enabled else None
        return None if parked is None else parked.next_seq

    def _refuse(self, origin, code, message, stream, seq, **extra) -> list:
        self.metrics.error(code)
        if code in ("overloaded", "no_slot"):
            self.metrics.count("dropped")
        err = {"type": "error", "code": code, "message": message, **extra}
        if stream is not None:
            err["stream"], err["seq"] = stream, seq
        raw = wire.encode(err)
        out = [("pub", b"error", raw)]
        if origin is not None:
            out.append(("reply", origin, raw))
        return out

    def _accept(self, d, origin, t_recv) -> list:
        # every check comes before any change: a refused message changes nothing
        name, seq = d["stream"], d["seq"]
        st = self.streams.get(name)
        parked = None
        if st is None and self.parking.enabled:
            parked = self.parking.get(name, t_recv)     # it left idle and comes back: resume
        expected = st.next_seq if st is not None else parked.next_seq if parked is not None else None
        resync = st is not None and st.resync
        if expected is not None and seq != expected:
            if seq < expected:
                return self._refuse(origin, "repeat", f"stream '{name}': seq {seq} was already received "
                                    f"(expected {expected})", name, seq, expected=expected)
            if not resync and self.cfg.engine.on_gap == "reject":
                return self._refuse(origin, "gap", f"stream '{name}': seq {seq} skips ahead (expected "
                                    f"{expected}); resend from {expected}", name, seq, expected=expected)
        if st is not None and len(st.pending) >= self.cfg.engine.max_pending:
            return self._refuse(origin, "overloaded", f"stream '{name}' has {len(st.pending)} steps queued; "
                                "slow down or raise engine.max_pending", name, seq, expected=seq)
        if st is None:
            slot = self._take_slot(fresh=parked is None)
            if slot is None:
                return self._refuse(origin, "no_slot", f"all {self.cfg.engine.slots} slots are busy; stream "
                                    f"'{name}' was not admitted (raise engine.slots or wait for idle streams)",
                                    name, seq)
            if parked is not None:
                self.learner.write_slot(slot, parked.state)
                self.parking.take(name)
                self.metrics.count("unparked")
            st = self.streams[name] = Stream(slot, expected, recent=self._recent(parked and parked.recent))
        if expected is not None and seq > expected:
            self.metrics.count("lost_on_resync", seq - expected)
        st.next_seq, st.resync, st.last_seen = seq + 1, False, t_recv
        st.pending.append((d, origin, t_recv))
        self._pending += 1
        self.metrics.count("accepted")
        if st.recent is None:
            return []
        st.recent.append(seq)
        if d["y"] is None or d["mode"] != "learn":
            return []
        # delayed labels: a y that comes with its x is that step's label, applied at once
        return self._apply_label(st, name, 0, d["y"], origin, ack=False)    # its step is the newest

    # ---- delayed labels (learning.label_delay) ----------------------------------------
    def _recent(self, seqs=None):
        d = self.learner.label_delay
        return deque(seqs or (), maxlen=d) if d else None

    def _label(self, lab, origin) -> list:
        """A ``label`` message: the target of an earlier data message of its stream, applied
        to the gradient its step kept (learner/labels.py) once every queued step of the stream
        has run. Refused (nothing changes): unknown_label, label_too_late, already_labelled."""
        name, seq = lab["stream"], lab["seq"]
        if not self.learner.label_delay:
            return self._refuse(origin, "bad_type", "label messages need learning.label_delay >= 1 (this "
                                "engine takes targets with their data messages only)", name, seq)
        st = self.streams.get(name)
        if st is None:
            return self._refuse(origin, "unknown_label", f"stream '{name}' holds no slot (unknown, idle or "
                                "parked): its labels cannot be applied", name, seq)
        try:
            age = len(st.recent) - 1 - st.recent.index(seq)      # one scan of the window
        except ValueError:
            late = len(st.recent) == st.recent.maxlen and seq < st.recent[0]
            why = f"came after {st.recent.maxlen} or more later data messages (learning.label_delay = " \
                f"{st.recent.maxlen})" if late else f"has no data message with seq {seq} (yet)"
            return self._refuse(origin, "label_too_late" if late else "unknown_label",
                                f"stream '{name}': the label of seq {seq} {why}", name, seq)
        return self._apply_label(st, name, age, lab["y"], origin, ack=True, seq=seq)

    def _apply_label(self, st, name, age, y, origin, ack: bool, seq=None) -> list:
        """Run the stream's queued steps, then apply the label of the step ``age`` data messages
        back; ``ack``: a label message (answered), not the y of a data message (answered by its
        prediction)."""
        out = []
        while st.pending:        # the label's step and every step before it run first
            out += self.tick()
        try:
            res = self.learner.label(y, age=age, slot=st.slot)
        except LabelError as e:
            if not ack:          # the data message was answered; its y could not be learned from
                self.metrics.count("labels_refused")
                return out
            why = LABEL_REFUSALS.get(e.code, "seq {seq}: {error}").format(seq=seq, error=e)
            return out + self._refuse(origin, e.code, f"stream '{name}': {why}", name, seq)
        self.metrics.count("labels")
        self.metrics.count("updates", int(res.applied))
        self.metrics.loss(name, res.loss)
        if not ack:
            return out
        self.metrics.count("answered")
        if origin is None:
            return out
        return out + [("reply", origin, wire.encode({"type": "label_ack", "stream": name, "seq": seq,
                                                     "loss": res.loss, "applied": res.applied}))]

    def _take_slot(self, fresh: bool = True):
        if not self.free:
            self.evict_idle()
        if not self.free:
            return None
        slot = self.free.pop()
        if fresh and slot not in self.unused:
            self.learner.reset_slot(slot)
        self.unused.discard(slot)
        return slot

    def evict_idle(self, now: float | None = None):
        """Free the slots of streams idle for longer than engine.idle_timeout_s; with
        engine.park_s their state is parked, to be restored if they return in time."""
        now = self.clock() if now is None else now
        lot = self.parking
        if lot.enabled:
            lot.expire(now)
        for name, st in list(self.streams.items()):
            if not st.pending and now - st.last_seen > self.cfg.engine.idle_timeout_s:
                if lot.enabled:
                    self.metrics.count("park_dropped", lot.park(name, now, st.next_seq, self.learner.read_slot(st.slot),
                                                                st.recent))
                    self.metrics.count("parked")
                del self.streams[name]
                self.metrics.forget(name)
                self.free.append(st.slot)

    def has_pending(self) -> bool:
        return self._pending > 0

    # ---- weights ------------------------------------------------------------------------
    def weights_message(self, kind: str) -> bytes:
        """'snapshot': everything that predicts at the current version: the weights (``params``),
        the rest of the predicting state (``state``: readout, transforms' statistics, experts;
        ``OnlineLearner.predictor_state``) and which slot serves which stream (``streams``).
        'update': a new version with the arrays that changed since the last publish (full
        values, so rebuilding is exact) and the streams' slots."""
        arrays = {**{f"params.{n}": v for n, v in self.learner.params.items()},
                  **{f"state.{n}": v for n, v in self.learner.predictor_state().items()}}
        streams = {name: st.slot for name, st in self.streams.items()}
        prev = self._published_params
        if kind == "update":
            base = self.version
            self.version += 1
            self._since_publish = 0
            sent = {n: v for n, v in arrays.items() if prev is None or n not in prev or not np.array_equal(prev[n], v)}
            self._published_params = arrays
            self.metrics.count("weights_published")
            return self._weights(kind, base, sent, streams)
        if prev is None or any(not np.array_equal(prev.get(n), v) for n, v in arrays.items()):
            # weights moved since the last publish: a snapshot gets its own version
            self.version += 1
            self._published_params = arrays
            self._since_publish = 0
        return self._weights(kind, None, arrays, streams)

    def _weights(self, kind, base, arrays, streams) -> bytes:
        part = lambda prefix: {n[len(prefix):]: wire.pack_array(v) for n, v in arrays.items() if n.startswith(prefix)}
        return wire.encode({"type": "weights", "kind": kind, "version": self.version, "base": base,
                            "params": part("params."), "state": part("state."), "streams": streams})

    def stats_message(self) -> bytes:
        snap = self.metrics.snapshot(len(self.streams), len(self.free))
        learner = self.learner.stats()
        snap["learner"] = {k: v for k, v in learner.items() if k not in ("prequential_loss", "metrics")}
        # rolling prequential metrics (user units, time constant metrics.window) per stream
        m = learner["metrics"]
        snap["stream_metrics"] = {name: {k: (int(m[k][st.slot]) if k == "n" else float(m[k][st.slot]))
                                         for k in ("mse", "mae", "nrmse", "n")}
                                  for name, st in self.streams.items()}
        for name, per in snap["stream_events"].items():     # the dashboard shows them beside the metrics
            if name in snap["stream_metrics"]:
                snap["stream_metrics"][name].update(per)
        self.metrics.quality(snap["stream_metrics"])
        snap["version"] = self.version
        snap["pending"] = self._pending                 # queued messages not yet stepped
        snap["parked_streams"] = len(self.parking)
        snap["mode"], snap["horizon"] = self.cfg.learning.mode, self.cfg.learning.horizon
        snap["batch_sizes"] = list(self.ready)    # steps one call over all slots takes
        snap["subset_sizes"] = list(self.ready_subsets)   # busy-slot counts with a call of their own
        return wire.encode({"type": "stats", **snap})

    # ---- durability ---------------------------------------------------------------------
    def save_checkpoint(self):
        if not self.ckpt:
            return None
        # queued messages are not in the saved state yet: record each stream's position as
        # the first message the checkpoint does not hold
        extra = {"steps": self.steps, "version": self.version,
                 "streams": {n: {"slot": s.slot, "next_seq": None if s.next_seq is None else s.next_seq - len(s.pending),
                                 **({} if s.recent is None else {"recent": _stepped(s)})}
                             for n, s in self.streams.items()}}
        path = self.ckpt.save(self.steps, self.learner.state_dict(), self.learner.signature(), extra)
        self._since_ckpt = 0
        self.metrics.count("checkpoints")
        return path

    def resume(self) -> dict | None:
        """Load the newest good checkpoint, if any. Returns its header (or None)."""
        if not self.ckpt:
            return None
        path, arrays, header, errors = self.ckpt.latest_good(self.learner.signature())
        self.resume_errors = errors
        if path is None:
            return None
        self.learner.load_state_dict(arrays)
        extra = header.get("extra", {})
        self.steps, self.version = int(extra.get("steps", 0)), int(extra.get("version", 0))
        self.streams.clear()
        used = set()
        for name, s in extra.get("streams", {}).items():
            self.streams[name] = Stream(int(s["slot"]), s["next_seq"], self.clock(), resync=True,
                                        recent=self._recent(s.get("recent")))
            used.add(int(s["slot"]))
        self.free = [i for i in range(self.cfg.engine.slots - 1, -1, -1) if i not in used]
        self.unused = set()              # the loaded state is in every slot: a new stream resets its slot
        self._published_params = None
        return {"path": str(path), **header}


def _stepped(st: Stream) -> list:
    """The seqs of the stream's data messages that have run (its ring holds their steps)."""
    seqs = list(st.recent)
    return seqs[:max(0, len(seqs) - len(st.pending))]
