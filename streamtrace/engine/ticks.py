"""A tick: the queued steps of the busy streams run and their replies are made.

Two paths. A slot bank (a model per stream, learner/bank.py) steps each queued step alone on
its stream's slot, through the one program every slot uses. Shared weights: one call over the
busy slots (a subset program, while few are busy) or over all slots (a loop of up to
micro_batch steps, or one-step calls in an engine without subsets). ``Ticks`` is the part of
``EngineCore`` that does this; the rest (ingest, streams, labels, durability) is in core.py.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Ticks"]


class Ticks:
    def tick(self, send=None) -> list:
        """One call for the queued steps; returns what to send. ``send``: a sender the replies
        may go to before the update runs (``reply_first``): the caller passes it when nothing
        else waits for the engine (its sockets are empty), so the extra call costs no message
        any time; under load the engine ticks without it, one call a step as before."""
        if not self._pending:
            return []
        if self.banked:
            return self._tick_bank(send)
        m, idx, count, call, arrays, taken = self._take()
        steps = self.steps + len(taken)
        early = self._early(send, count, m)
        if early:       # the prediction program: the same bits as the step's (programs.predict)
            send(self._answers(taken, [self._predicted(m, idx, call, arrays)], steps))
            self.metrics.count("replied_first", len(taken))
        results = self._call(m, idx, count, call, *arrays)
        return self._after(taken, results, steps, early)

    def _after(self, taken, results, steps, early) -> list:
        """A call's bookkeeping once its steps ran; its replies unless sent early."""
        self.steps = steps
        self._since_publish += len(taken)
        self._since_ckpt += len(taken)
        self.metrics.count("steps", len(taken))
        self.metrics.count("updates", sum(1 for r in results if r.applied is True or
                                          (r.applied is not False and r.applied.any())))
        out = [] if early else self._answers(taken, results, steps)
        every = self.cfg.publish.weights_every
        if every and self._since_publish >= every:
            out.append(("pub", b"weights", self.weights_message("update")))
        return out

    def _tick_bank(self, send) -> list:
        """``tick`` of a slot bank: each queued step (up to micro_batch per stream) runs alone
        on its stream's slot, through the one program every slot uses. One step per busy
        stream with ``send``: every prediction first (sent), then the steps."""
        busy, count = self._busy()
        bank = self.learner
        x, y, active, learn = bank.views()
        active[0] = True
        work, taken = [], []
        for st in busy:
            for _ in range(min(len(st.pending), count)):
                d, origin, t_recv = st.pending.popleft()
                work.append((st.slot, d, self._learns(st, d)))
                taken.append((len(taken), 0, d, origin, t_recv))     # results[j], its slot axis of 1
        self._pending -= len(taken)

        def fill(d, fit):
            x[0] = d["x"]
            y[0] = 0 if d["y"] is None else d["y"]
            learn[0] = fit
        steps = self.steps + len(taken)
        early = self._early(send, count, None)
        if early:       # the prediction program: the same bits as the step's (programs.predict)
            predicted = []
            for slot, d, fit in work:
                fill(d, fit)
                predicted.append(bank.run_predict(slot))
            send(self._answers(taken, predicted, steps))
            self.metrics.count("replied_first", len(taken))
        results = []
        for slot, d, fit in work:
            fill(d, fit)
            results.append(bank.run(slot))
        return self._after(taken, results, steps, early)

    def _busy(self):
        """The streams with queued steps and how many steps of each this tick takes (up to
        micro_batch); a checkpoint that those steps would make overdue is written first."""
        busy = [st for st in self.streams.values() if st.pending]
        count = min(max(len(st.pending) for st in busy), self.cfg.engine.micro_batch)
        if self.ckpt and self._since_ckpt + sum(min(len(st.pending), count) for st in busy) > self.cfg.checkpoint.every:
            self.save_checkpoint()
        return busy, count

    def _learns(self, st, d) -> bool:
        """Whether the queued step ``d`` of stream ``st`` learns: a learn message, and in
        supervised mode one with its target (or a later label, learning.label_delay)."""
        return d["mode"] == "learn" and (self.cfg.learning.mode != "supervised" or d["y"] is not None
                                         or st.recent is not None)

    def _early(self, send, count: int, m) -> bool:
        """Whether this tick's replies go before its update (``reply_first``): a sender, one
        step per stream, and the prediction program of the call (``_predict_key(m)``) ready."""
        early = send is not None and self.reply_first and count == 1 and \
            self.learner.programs.is_compiled(("predict", self._predict_key(m)))
        self.replied_first = early
        return early

    def _take(self):
        """Queued steps into the inputs of one call: (m, idx, count, call, (xs, ys, active,
        learn), taken), m the subset size (None: all slots), taken (step, position, message,
        origin, t_recv) per step."""
        busy, count = self._busy()
        # few busy streams: a call over their slots only (once compiled), else all slots
        m = next((m for m in self.ready_subsets if m >= len(busy)), None)
        K = self.cfg.engine.micro_batch
        supervised = self.cfg.learning.mode == "supervised"
        idx = None
        if m is None:
            # one program and one step: its own input views, filled in place (the latency path)
            kind = "loop" if self.looped else "burst" if count > 1 else None
            call, (xs, ys, active, learn) = self._inputs(K if kind else 1, kind)
            pos = [st.slot for st in busy]
        else:
            call, (xs, ys, active, learn) = self._inputs(K, m)
            busy.sort(key=lambda st: st.slot)   # slot order: shared weights sum as the full call does
            idx = self._subset_index(m, busy, call[0])
            where = {s: i for i, s in enumerate(idx.tolist())}
            pos = [where[st.slot] for st in busy]
        taken = []
        for st, p in zip(busy, pos):
            for j in range(min(len(st.pending), count)):
                d, origin, t_recv = st.pending.popleft()
                xs[j, p] = d["x"]
                active[j, p] = True
                learn[j, p] = self._learns(st, d)
                if supervised and d["y"] is not None:
                    ys[j, p] = d["y"]
                taken.append((j, p, d, origin, t_recv))
        self._pending -= len(taken)
        return m, idx, count, call, (xs, ys, active, learn), taken

    def _answers(self, taken, results, steps) -> list:
        """The replies and publications of the steps ``taken`` from their ``results``."""
        encode, metrics, publish = self._reply, self.metrics, self.cfg.publish.predictions
        signal = publish and self.cfg.publish.signal
        out, version, now = [], self.version, self.clock()
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

    def _predict_key(self, m):
        """Which prediction program goes with the call over subset m (None: all slots)."""
        if self.banked:
            return None
        K = self.cfg.engine.micro_batch
        return ("subset", m, K) if m is not None else ("loop", K) if self.looped else None

    def _predicted(self, m, idx, call, arrays):
        """One step's results from the prediction program of the call ``_call`` makes next
        (the state is not touched; applied flags all False)."""
        L, key = self.learner, self._predict_key(m)
        if m is not None:
            return L.run_predict(key, idx, np.int32(1), *arrays)
        if self.looped:
            return L.run_predict(key, np.int32(1), *arrays)
        return L.run_predict(key, *call)

    def _call(self, m, idx, count, call, xs, ys, active, learn) -> list:
        """``count`` steps: a subset call (m slots), the loop program over all slots, or, in an
        engine with one program, a one-step call per step (``call``, its inputs already filled
        when count is 1; a burst is copied in step by step) (determinism.md)."""
        L = self.learner
        if m is not None:
            return L.run_subset(idx, count, xs, ys, active, learn)
        if self.looped:
            return L.run_loop(count, xs, ys, active, learn)
        if count == 1:
            return [L.run(*call)]
        call, one = self._inputs(1)
        results = []
        for j in range(count):
            for view, steps in zip(one, (xs, ys, active, learn)):
                view[0] = steps[j]
            results.append(L.run(*call))
        return results

    def _subset_index(self, m, busy, out):
        """The slots of a subset call, written into ``out`` (the program's index input): the
        busy streams' slots in order, padded to m with slots that stay idle in it (the step
        leaves an inactive slot as it is)."""
        used = [st.slot for st in busy]
        if len(used) < m:
            taken = set(used)
            used += [s for s in range(self.learner.n) if s not in taken][:m - len(used)]
        out[:] = used
        return out

    def _inputs(self, k, m=None):
        """The input arrays of a call of k steps of all slots (m None: the one-step program;
        "loop": the loop program) or of an m-slot subset:
        (the arrays to pass, the (k, slots, ...) arrays to fill). They are views of the buffer
        the program's inputs cross in (learner/inputs.py), so filled here they are passed
        without a copy. Masks cleared; stale x/y of inactive slots are ignored by the step."""
        views = self._input_cache.get((k, m))
        if views is None:
            L = self.learner
            if m == "loop":       # (count, x, y, active, learn): fill the last four
                call = L.programs.loop(k).inputs.views
                views = (call, call[1:])
            elif m == "burst":    # k steps for k one-step calls (``_call``)
                x, y, a = L.programs.example_inputs(k)
                views = (None, (x, y, a, a.copy()))
            elif m is not None:   # (slot indices, count, x, y, active, learn): fill the last four
                call = L.programs.subset(m, k).inputs.views
                views = (call, call[2:])
            else:       # the one-step program's inputs have no step axis: fill them as (1, ...)
                call = L.programs.step().inputs.views
                views = (call, tuple(v[None] for v in call))
            self._input_cache[(k, m)] = views
        views[1][2].fill(False)
        views[1][3].fill(False)
        return views


def _events(r, p) -> dict | None:
    """What happened to slot ``p``'s step besides its answer (the reply's flags), or None."""
    got = {}
    for key in ("outlier", "rolled_back"):
        v = getattr(r, key)
        if bool(v[p] if isinstance(v, np.ndarray) else v):
            got[key] = True
    return got or None
