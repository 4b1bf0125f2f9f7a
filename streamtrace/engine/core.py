"""The engine without sockets: validate, route streams to slots, batch, step, answer.

``ingest(raw, origin)`` checks one message and queues it (or answers with an error at once);
``tick()`` runs every queued step in one compiled call and returns what to send. Outputs are
``("reply", origin, bytes)`` for the sender (origin None: fire-and-forget) and
``("pub", topic, bytes)`` for subscribers. No learner state changes for a refused message,
and any failure while handling one message is a refusal (code ``internal``), never a crash.
Streams evicted for being idle are parked (``parking.py``) and resume if they return in time.

An engine composes three parts, each with explicit inputs: the stream table (streams.py:
admission, slots, parking), the tick planner (planner.py: queued steps into compiled calls of
the learner) and the answers (answers.py: replies from a call's results). It owns what ties
them together: the learner, the metrics, labels, weights and checkpoints.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from streamtrace_runner.weights import served

from .. import wire
from ..learner.bank import SlotBank
from ..checkpoints import position_extra, position_of
from ..learner.checkpoint import CheckpointDir
from ..learner.labels import LabelError
from ..learner.mixture_upgrade import fit_checkpoint
from ..recipe.build import build_learner
from .answers import Answers
from .config import EngineConfig
from .counters import EngineCounters
from .planner import TickPlanner, subset_sizes
from .reply_first import allowed as reply_first_allowed
from .streams import Refused, Stream, StreamTable

__all__ = ["EngineCore", "Stream", "subset_sizes"]

log = logging.getLogger("streamtrace.engine")

# a refused label in its stream's terms (the learner counts steps back in a slot, which users never see)
LABEL_REFUSALS = {"unknown_label": "data message seq {seq} left nothing to label (it did not learn: "
                                   "mode 'predict', or a step that was skipped)",
                  "already_labelled": "seq {seq} was already labelled"}


class EngineCore:
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
        self.metrics = EngineCounters()
        self.table = StreamTable(self.learner, ec, self.metrics, clock)
        self._internal_logged: set = set()
        self.version = 0                 # weights version (bumped at every publish)
        self.steps = 0                   # accepted data messages processed
        self._since_publish = 0
        self._since_ckpt = 0
        self._published_params: dict | None = None
        self._published_slots: list | None = None
        self.ckpt = CheckpointDir(cfg.checkpoint.dir, cfg.checkpoint.keep) if cfg.checkpoint.dir else None
        # reply first: where a prediction does not depend on its step's update, a one-step
        # call's replies may leave after a prediction program, before the step runs (tick)
        lc = cfg.learning
        self.reply_first = ec.reply_first and reply_first_allowed(
            {"mode": lc.mode, "forecast_before_update": lc.forecast_before_update})
        self.replied_first = False       # the last tick sent its replies before its update
        self.planner = TickPlanner(self.learner, ec.micro_batch, self.banked, lc.mode == "supervised",
                                   self.reply_first)
        self.answers = Answers(wire.PredictionEncoder(), self.metrics, cfg.publish, clock)

    # the parts' state, under the names the server, the cluster and the tests know
    streams = property(lambda self: self.table.streams)
    free = property(lambda self: self.table.free)
    parking = property(lambda self: self.table.parking)
    subsets = property(lambda self: self.planner.subsets)
    ready = property(lambda self: self.planner.ready)
    looped = property(lambda self: self.planner.looped)

    @property
    def ready_subsets(self) -> list:
        return self.planner.ready_subsets

    @ready_subsets.setter
    def ready_subsets(self, sizes):
        self.planner.ready_subsets = sizes

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
            L.programs.predict(self.planner.predict_key(None))
            yield
        for m in self.subsets:
            if m not in self.ready_subsets:
                L.programs.subset(m, self.cfg.engine.micro_batch)
                if self.reply_first:     # its prediction twin before it serves (tick asks for both)
                    L.programs.predict(self.planner.predict_key(m))
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
                expected = self.table.expected(stream, t_recv)
                if expected is not None:
                    extra["expected"] = expected
            return self._refuse(origin, e.code, str(e), stream, seq, **extra)
        if kind == "label":
            return self._label(label, origin)
        return self._accept(data, origin, t_recv)

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
        try:
            st = self.table.admit(name, seq, (d, origin, t_recv), t_recv)
        except Refused as e:
            return self._refuse(origin, e.code, str(e), name, seq, **e.extra)
        self.metrics.count("accepted")
        if st.recent is None:
            return []
        st.recent.append(seq)
        if d["y"] is None or d["mode"] != "learn":
            return []
        # delayed labels: a y that comes with its x is that step's label, applied at once
        return self._apply_label(st, name, 0, d["y"], origin, ack=False)    # its step is the newest

    # ---- a tick -------------------------------------------------------------------------
    def tick(self, send=None) -> list:
        """One call for the queued steps; returns what to send. ``send``: a sender the replies
        may go to before the update runs (``reply_first``): the caller passes it when nothing
        else waits for the engine (its sockets are empty), so the extra call costs no message
        any time; under load the engine ticks without it, one call a step as before."""
        table = self.table
        if not table.pending:
            return []
        busy, count = table.busy(self.cfg.engine.micro_batch)
        if self.ckpt and self._since_ckpt + sum(min(len(st.pending), count) for st in busy) > self.cfg.checkpoint.every:
            self.save_checkpoint()      # one the steps would make overdue is written first
        planner = self.planner
        plan = planner.take(busy, count)
        taken = plan[5]
        table.pending -= len(taken)
        steps = self.steps + len(taken)
        early = self.replied_first = send is not None and planner.early(send, count, plan[0])
        if early:       # the prediction program: the same bits as the step's (programs.predict)
            send(self.answers(taken, planner.predicted(plan), steps, self.version))
            self.metrics.count("replied_first", len(taken))
        results = planner.run(plan)
        self.steps = steps
        self._since_publish += len(taken)
        self._since_ckpt += len(taken)
        self.metrics.count("steps", len(taken))
        self.metrics.count("updates", sum(1 for r in results if r.applied is True or
                                          (r.applied is not False and r.applied.any())))
        out = [] if early else self.answers(taken, results, steps, self.version)
        every = self.cfg.publish.weights_every
        if every and self._since_publish >= every:
            out.append(("pub", b"weights", self.weights_message("update")))
        return out

    # ---- delayed labels (learning.label_delay) ----------------------------------------
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
        return self.table.take_slot(fresh)

    def evict_idle(self, now: float | None = None):
        """Free the slots of idle streams, parking their state (``StreamTable.evict_idle``)."""
        self.table.evict_idle(now)

    def has_pending(self) -> bool:
        return self.table.pending > 0

    # ---- weights ------------------------------------------------------------------------
    def weights_message(self, kind: str) -> bytes:
        """'snapshot': everything that predicts at the current version: the weights (``params``),
        the rest of the predicting state (``state``: readout, transforms' statistics, experts;
        ``OnlineLearner.predictor_state``), each array's rows those of the slots serving a
        stream (``slots``; with shared weights ``params`` have no slot axis) and each stream's
        row (``streams``). 'update': a new version with the arrays that changed since the last
        publish (full values, so rebuilding is exact; every array where the slots changed)."""
        slots, streams = served({name: st.slot for name, st in self.streams.items()})
        rows = lambda v: np.asarray(v)[np.asarray(slots, np.intp)]      # noqa: E731
        arrays = {**{f"params.{n}": rows(v) if self.banked else v for n, v in self.learner.params.items()},
                  **{f"state.{n}": rows(v) for n, v in self.learner.predictor_state().items()}}
        prev = self._published_params if self._published_slots == slots else None
        moved = [n for n, v in arrays.items() if prev is None or n not in prev or not np.array_equal(prev[n], v)]
        base = self.version if kind == "update" else None
        if kind == "update" or moved:    # a snapshot where nothing moved keeps the version
            self.version += 1
            self._published_params, self._published_slots = arrays, slots
            self._since_publish = 0
        if kind == "update":
            self.metrics.count("weights_published")
            arrays = {n: arrays[n] for n in moved}
        part = lambda prefix: {n[len(prefix):]: wire.pack_array(v) for n, v in arrays.items() if n.startswith(prefix)}  # noqa: E731
        return wire.encode({"type": "weights", "kind": kind, "version": self.version, "base": base,
                            "params": part("params."), "state": part("state."), "slots": slots,
                            "streams": streams})

    def stats_message(self) -> bytes:
        snap = self.metrics.snapshot(len(self.streams), len(self.free))
        learner = self.learner.stats()
        snap["learner"] = {k: v for k, v in learner.items() if k not in ("prequential_loss", "metrics", "seasons")}
        # rolling prequential metrics (user units, time constant metrics.window) per stream
        m = learner["metrics"]
        snap["stream_metrics"] = {name: {k: (int(m[k][st.slot]) if k == "n" else float(m[k][st.slot]))
                                         for k in ("mse", "mae", "nrmse", "n")}
                                  for name, st in self.streams.items()}
        for name, per in snap["stream_events"].items():     # the dashboard shows them beside the metrics
            if name in snap["stream_metrics"]:
                snap["stream_metrics"][name].update(per)
        self.metrics.quality(snap["stream_metrics"])
        if "seasons" in learner:      # per stream and channel: [the season used, the other one found]
            snap["stream_seasons"] = {name: learner["seasons"][st.slot].tolist() for name, st in self.streams.items()}
        snap["version"] = self.version
        snap["pending"] = self.table.pending                 # queued messages not yet stepped
        snap["parked_streams"] = len(self.parking)
        snap["mode"], snap["horizon"] = self.cfg.learning.mode, self.cfg.learning.horizon
        snap["batch_sizes"] = list(self.planner.ready)    # steps one call over all slots takes
        snap["subset_sizes"] = list(self.planner.ready_subsets)   # busy-slot counts with a call of their own
        return wire.encode({"type": "stats", **snap})

    # ---- durability ---------------------------------------------------------------------
    def save_checkpoint(self):
        if not self.ckpt:
            return None
        # queued messages are not in the saved state yet: record each stream's position as
        # the first message the checkpoint does not hold
        extra = position_extra(self.steps, self.version, self.table.positions())
        path = self.ckpt.save(self.steps, self.learner.state_dict(), self.learner.signature(), extra)
        self._since_ckpt = 0
        self.metrics.count("checkpoints")
        return path

    def resume(self) -> dict | None:
        """Load the newest good checkpoint, if any. Returns its header (or None)."""
        if not self.ckpt:
            return None
        path, arrays, header, errors = self.ckpt.latest_good()
        self.resume_errors = errors
        if path is None:
            return None
        # another kind of experts' mixture (an older release's default) resumes all but the mixture
        arrays = fit_checkpoint(path, self.learner.signature(), header, arrays, self.learner.state_dict)
        self.learner.load_state_dict(arrays)
        self.steps, self.version, streams = position_of(header)
        self.table.restore(streams, self.clock())
        self._published_params = None
        return {"path": str(path), **header}

