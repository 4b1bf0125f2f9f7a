"""The runner's ``stats`` message, with ``serve``'s keys where they mean the same: the server's
counters, latency percentiles, per-stream loss and events (counters.py), the learner's own
counters summed over slots (``learner``), each stream's rolling prequential metrics
(``stream_metrics``: mse, mae, nrmse, n, in user units, time constant metrics.window), streams,
slots_free, parked_streams, version, mode and horizon; with a seasonal experts' mixture each
stream's seasons (``stream_seasons``)."""
from __future__ import annotations

import numpy as np

from .rolling import summary

__all__ = ["stats_snapshot", "learner_stats", "seasons_of"]

# the learner's step counters, in the order of its ``stats.counters`` columns (an export's
# manifest names them; this is the order of exports that do not)
COUNTERS = ("step", "updates", "skipped", "rejected", "since_update")
_ROLL = ("stats.roll.se", "stats.roll.ae", "stats.roll.y", "stats.roll.y2", "stats.roll.n")
_EVENTS = (("screen.count", "outliers"), ("rollback.count", "rolled_back"))


def learner_stats(named: dict, counters=COUNTERS, window: int = 1000) -> dict:
    """``OnlineLearner.stats()`` of a bank's checkpoint arrays ``named`` (slots first): the
    counters summed over slots ("step": the most any slot took), and per slot ``metrics``
    (rolling mse, mae, nrmse, n; outliers and rolled_back where the learner counts them).

    >>> named = {"stats.counters": np.array([[[3, 2, 0, 0, 1]], [[5, 4, 1, 0, 0]]])}
    >>> out = learner_stats(named); out["step"], out["updates"], out["skipped"]
    (5, 6, 1)
    """
    c = np.asarray(named["stats.counters"]).reshape(-1, len(counters))
    out = {name: int(c[:, i].sum()) for i, name in enumerate(counters) if name != "since_update"}
    out["step"] = int(c[:, 0].max())
    if all(k in named for k in _ROLL):
        roll = {k[len("stats.roll."):]: np.asarray(named[k]) for k in _ROLL}
        roll = {k: v.reshape(-1) if k == "n" else v.reshape(-1, v.shape[-1]) for k, v in roll.items()}
        out["metrics"] = summary(roll, window)
        for key, name in _EVENTS:
            if key in named:
                per = np.asarray(named[key]).reshape(-1)
                out[name] = int(per.sum())
                out["metrics"][name] = per.astype(np.int64)
    return out


def seasons_of(aux_int, spec: dict) -> np.ndarray:
    """The seasons the experts use, (slots, channels, 2): [the season the seasonal expert uses,
    the other one found] (0: none), from the ``combine.aux.int`` arrays of the slots (slots
    first) and the manifest's ``seasons`` (a known ``period``, or the ``first`` and ``second``
    columns per channel), as ``OnlineLearner.stats()["seasons"]``.

    >>> aux = np.array([[0, 12, 0, 5], [0, 12, 24, 5]])
    >>> seasons_of(aux, {"first": [1], "second": [2]}).tolist()
    [[[12, 0]], [[24, 12]]]
    """
    aux = np.asarray(aux_int)
    aux = aux.reshape(-1, aux.shape[-1])
    if "period" in spec:
        out = np.zeros((len(aux), 1, 2), np.int64)
        out[..., 0] = spec["period"]
        return out
    first, second = aux[:, spec["first"]], aux[:, spec["second"]]
    use = np.where(second > 0, second, first)
    other = np.where(second > 0, first, 0)
    return np.stack([use, other], axis=-1).astype(np.int64)


def stats_snapshot(core) -> dict:
    """The stats of a ``core.RunnerCore`` (its metrics, bank, streams), as ``serve``'s engine
    builds them.

    >>> import tempfile
    >>> from streamtrace.export.write import export_learner     # (where streamtrace is installed)
    >>> from streamtrace_runner import wire
    >>> from streamtrace_runner.runtime import Runner
    >>> from streamtrace_runner.bank import RunnerBank
    >>> from streamtrace_runner.core import Options, RunnerCore
    >>> folder = tempfile.mkdtemp(); _ = export_learner(None, folder)
    >>> core = RunnerCore(RunnerBank(Runner(folder), 2), Options(slots=2))
    >>> _ = core.ingest(wire.data_message("s", 0, np.array([0.5])), b"me")
    >>> snap = stats_snapshot(core); snap["steps"], snap["learner"]["step"], sorted(snap["stream_metrics"])
    (1, 1, ['s'])
    """
    m = core.bank.runner.manifest
    snap = core.metrics.snapshot(len(core.streams), len(core.free))
    spec = m.get("seasons")
    aux = ("combine.aux.int",) if spec else ()
    names = [n for n in ("stats.counters", *_ROLL, *(k for k, _ in _EVENTS), *aux) if n in core.bank.runner.map.names]
    # the slots stepped so far (a fresh slot's counters and metrics are zeros: it adds nothing,
    # and reading it would make its initial state)
    slots = [s for s in range(core.bank.n) if core.bank.slots[s] is not None]
    per_slot = [core.bank.slot_state(s, names) for s in slots]
    named = {k: np.concatenate([p[k] for p in per_slot]) for k in names} if slots else \
        {"stats.counters": np.zeros((1, len(m.get("counters", COUNTERS))), np.int64)}
    learner = learner_stats(named, m.get("counters", COUNTERS), m["config"]["metrics"]["window"])
    per, row = learner.pop("metrics", None), {s: i for i, s in enumerate(slots)}
    snap["learner"] = learner
    snap["stream_metrics"] = {} if per is None else {
        name: {k: (int(per[k][row[st.slot]]) if k == "n" else float(per[k][row[st.slot]]))
               for k in ("mse", "mae", "nrmse", "n")}
        for name, st in core.streams.items() if st.slot in row}
    for name, ev in snap["stream_events"].items():      # beside the metrics, as serve's dashboard reads them
        if name in snap["stream_metrics"]:
            snap["stream_metrics"][name].update(ev)
    if spec:     # the slots stepped so far, as stream_metrics
        found = seasons_of(named["combine.aux.int"], spec) if slots else None
        snap["stream_seasons"] = {name: found[row[st.slot]].tolist() for name, st in core.streams.items() if st.slot in row}
    snap.update(version=core.version, pending=0, parked_streams=len(core.parking),
                mode=m["config"]["learning"]["mode"], horizon=m["config"]["learning"]["horizon"])
    return snap
