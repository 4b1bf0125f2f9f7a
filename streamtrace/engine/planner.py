"""The tick planner: a tick's queued steps into the inputs of compiled calls, and the calls.

Two paths. A slot bank (a model per stream, learner/bank.py) steps each queued step alone on
its stream's slot, through the one program every slot uses. Shared weights: one call over the
busy slots (a subset program, while few are busy) or over all slots (a loop of up to
micro_batch steps, or one-step calls in an engine without subsets). The planner's inputs are
explicit: the learner it calls, the engine settings it was built with, and per tick the busy
streams, the steps each gives and which of them learn (``take``); what a tick does with the
results (replies, counts) is the engine's (core.py).
"""
from __future__ import annotations

import numpy as np

__all__ = ["TickPlanner", "PLAN", "subset_sizes"]


def subset_sizes(slots: int) -> list[int]:
    """Busy-slot counts with a call of their own (see TickPlanner): 2 <= m <= slots / 4."""
    return [1 << i for i in range(1, slots.bit_length()) if 4 << i <= slots]


# One tick's call (``TickPlanner.take``), a tuple (made at every tick): m the subset size (None:
# all slots, or a bank's steps), idx the subset's slots, count steps per slot, call / arrays its
# inputs, taken (result index, position, message, origin, t_recv) per step, work (slot,
# message, learns) per step of a bank (else None).
PLAN = ("m", "idx", "count", "call", "arrays", "taken", "work")


class TickPlanner:
    """The calls of an engine's ticks over ``learner``.

    Parameters
    ----------
    learner : OnlineLearner or SlotBank
        What the calls step (``run*`` / ``run_predict``; a bank's ``run(slot)``).
    micro_batch : int
        Steps per slot one call takes at most.
    banked : bool
        ``learner`` is a SlotBank.
    supervised : bool
        Targets come with the data messages (learning.mode "supervised"): they are passed.
    reply_first : bool
        A one-step tick may answer from the prediction program before its update.

    >>> TickPlanner.__name__, subset_sizes(16)
    ('TickPlanner', [2, 4])
    """

    def __init__(self, learner, micro_batch: int, banked: bool, supervised: bool, reply_first: bool):
        self.learner, self.micro_batch, self.banked, self.reply_first = learner, micro_batch, banked, reply_first
        self.supervised = supervised
        # shared weights: a call with few busy streams steps only their slots: programs for
        # 2 <= m <= slots / 4 busy slots (powers of two), each taking up to micro_batch steps
        # per slot. Gathering and writing back makes a slot cost ~1.6x its share of the full
        # step (measured, GRU-64 / 256 D-RTRL), and each program holds ~12 MB of code: larger
        # subsets gain too little. (A slot bank steps each busy slot alone: no subsets.)
        self.subsets = subset_sizes(learner.n) if learner.slots and not banked else []
        self.ready_subsets = list(self.subsets)
        # With subset programs (loops), a call over all slots is a loop too (up to micro_batch
        # steps, their number given at run time: one program for any burst); without them,
        # one program, the one-step one, and a burst takes one call per step.
        self.looped = bool(self.subsets)
        self.ready = [micro_batch] if self.looped else [1]   # steps one call over all slots takes
        self._input_cache: dict = {}

    def predict_key(self, m):
        """Which prediction program goes with the call over subset m (None: all slots)."""
        if self.banked:
            return None
        K = self.micro_batch
        return ("subset", m, K) if m is not None else ("loop", K) if self.looped else None

    def early(self, send, count: int, m) -> bool:
        """Whether a tick's replies go before its update (``reply_first``): a sender, one
        step per stream, and the prediction program of the call (``predict_key(m)``) ready."""
        return send is not None and self.reply_first and count == 1 and \
            self.learner.programs.is_compiled(("predict", self.predict_key(m)))

    # ---- queued steps into a call's inputs ----------------------------------------------
    def learns(self, st, d) -> bool:
        """Whether the queued step ``d`` of stream ``st`` learns: a learn message, and in
        supervised mode one with its target (or a later label, learning.label_delay)."""
        return d["mode"] == "learn" and (not self.supervised or d["y"] is not None or st.recent is not None)

    def take(self, busy, count: int) -> tuple:
        """Up to ``count`` queued steps of each of the ``busy`` streams (taken off their
        queues) into one tick's call."""
        learns = self.learns
        if self.banked:
            return self._take_bank(busy, count, learns)
        # few busy streams: a call over their slots only (once compiled), else all slots
        m = next((m for m in self.ready_subsets if m >= len(busy)), None)
        K, supervised = self.micro_batch, self.supervised
        idx = None
        if m is None:
            # one program and one step: its own input views, filled in place (the latency path)
            kind = "loop" if self.looped else "burst" if count > 1 else None
            call, (xs, ys, active, learn) = self.inputs(K if kind else 1, kind)
            pos = [st.slot for st in busy]
        else:
            call, (xs, ys, active, learn) = self.inputs(K, m)
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
                learn[j, p] = learns(st, d)
                if supervised and d["y"] is not None:
                    ys[j, p] = d["y"]
                taken.append((j, p, d, origin, t_recv))
        return m, idx, count, call, (xs, ys, active, learn), taken, None

    def _take_bank(self, busy, count, learns) -> tuple:
        """A slot bank's tick: each queued step (up to ``count`` per stream) runs alone on its
        stream's slot; results[j] has a slot axis of 1."""
        work, taken = [], []
        for st in busy:
            for _ in range(min(len(st.pending), count)):
                d, origin, t_recv = st.pending.popleft()
                work.append((st.slot, d, learns(st, d)))
                taken.append((len(taken), 0, d, origin, t_recv))
        return None, None, count, None, None, taken, work

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

    def inputs(self, k, m=None):
        """The input arrays of a call of k steps of all slots (m None: the one-step program;
        "loop": the loop program) or of an m-slot subset:
        (the arrays to pass, the (k, slots, ...) arrays to fill). They are views of the buffer
        the program's inputs cross in (learner/inputs.py), so filled here they are passed
        without a copy. Masks cleared; stale x/y of inactive slots are ignored by the step."""
        views = self._input_cache.get((k, m))
        if views is None:
            P = self.learner.programs
            if m == "loop":       # (count, x, y, active, learn): fill the last four
                call = P.loop(k).inputs.views
                views = (call, call[1:])
            elif m == "burst":    # k steps for k one-step calls (``run``)
                x, y, a = P.example_inputs(k)
                views = (None, (x, y, a, a.copy()))
            elif m is not None:   # (slot indices, count, x, y, active, learn): fill the last four
                call = P.subset(m, k).inputs.views
                views = (call, call[2:])
            else:       # the one-step program's inputs have no step axis: fill them as (1, ...)
                call = P.step().inputs.views
                views = (call, tuple(v[None] for v in call))
            self._input_cache[(k, m)] = views
        views[1][2].fill(False)
        views[1][3].fill(False)
        return views

    # ---- the calls ----------------------------------------------------------------------
    def predicted(self, plan: tuple) -> list:
        """The first step's results of ``plan`` from the prediction program of its call (the
        state is not touched; applied flags all False): the same bits as ``run``'s."""
        L, (m, idx, _, call, arrays, _, work) = self.learner, plan
        if work is not None:
            return [L.run_predict(slot, d["x"], d["y"], fit) for slot, d, fit in work]
        key = self.predict_key(m)
        if m is not None:
            return [L.run_predict(key, idx, np.int32(1), *arrays)]
        if self.looped:
            return [L.run_predict(key, np.int32(1), *arrays)]
        return [L.run_predict(key, *call)]

    def run(self, plan: tuple) -> list:
        """``plan``'s steps: a bank's slot steps, a subset call (m slots), the loop program over
        all slots, or, in an engine with one program, a one-step call per step (its inputs
        already filled when count is 1; a burst is copied in step by step) (determinism.md)."""
        L, (m, idx, count, call, arrays, _, work) = self.learner, plan
        if work is not None:
            return [L.run(slot, d["x"], d["y"], fit) for slot, d, fit in work]
        if m is not None:
            return L.run_subset(idx, count, *arrays)
        if self.looped:
            return L.run_loop(count, *arrays)
        if count == 1:
            return [L.run(*call)]
        call, one = self.inputs(1)
        results = []
        for j in range(count):
            for view, steps in zip(one, arrays):
                view[0] = steps[j]
            results.append(L.run(*call))
        return results
