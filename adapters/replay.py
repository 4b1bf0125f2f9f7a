"""Replay a recorded file into an engine, one row per data message (``streamtrace replay FILE``).

Rows of a CSV / NPY / Parquet file go through :class:`SensorClient` (request/reply), paced by a
timestamp column, a fixed rate, or as fast as the engine answers. The replies are scored
prequentially: the engine predicts before it learns, so the reply to a row is, in forecast
mode, the prediction of the next row's inputs and, in supervised mode (target columns sent
as ``y``), the prediction of the row's own targets.

A row that cannot be sent (a cell that is not a number, NaN, a missing cell, an unreadable
timestamp) is skipped and reported with its line; a row the engine refuses is counted by the
error code. Neither stops the replay.
"""
from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from streamtrace.evaluation import files
from streamtrace.evaluation.files import Table, number, timestamp
from streamtrace.evaluation.leads import format_leads
from streamtrace.transport.client import EngineError, SensorClient

from .replay_leads import score_replay_leads

__all__ = ["ReplayError", "Table", "Rows", "ReplayResult", "FileUnits", "read_table", "select_rows", "replay",
           "write_predictions", "run_cli"]

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
SHOWN_BAD_ROWS = 10          # bad rows listed by line; the rest are only counted


class ReplayError(ValueError):
    """A file, column choice or engine that the replay cannot work with."""


# ---- reading ------------------------------------------------------------------------------
def read_table(path: str | Path) -> Table:
    """:func:`streamtrace.evaluation.files.read_table`, its errors as ReplayError."""
    try:
        return files.read_table(path)
    except files.FileError as e:
        raise ReplayError(str(e)) from None


# ---- choosing what to send ---------------------------------------------------------------------
@dataclass
class Rows:
    inputs: list[str]
    targets: list[str]
    x: np.ndarray                   # (rows, inputs); a bad row's values are not used
    y: np.ndarray | None            # (rows, targets) in supervised mode
    ts: np.ndarray | None           # seconds, when a time column is given
    bad: dict[int, str]             # row index -> why it is not sent
    note: str = ""                  # time-like columns left out of the inputs (files.Columns.note)


def select_rows(table: Table, columns=None, target_columns=None, time_column: str | None = None) -> Rows:
    """Inputs, targets and timestamps as arrays (columns chosen by
    :func:`streamtrace.evaluation.files.choose_columns`, as ``evaluate`` chooses them), and the rows that
    cannot be sent, with the reason."""
    try:
        chosen = files.choose_columns(table, columns, target_columns, time_column)
    except files.FileError as e:
        raise ReplayError(str(e)) from None
    inputs, targets, times = chosen.inputs, chosen.targets, [chosen.time] if chosen.time else []
    if len(table) == 0:
        raise ReplayError("the file has no data rows")
    bad: dict[int, str] = {}

    def values(names):
        a = np.empty((len(table), len(names)))
        for j, n in enumerate(names):
            for i, cell in enumerate(table.columns[n]):
                a[i, j] = v = number(cell)
                if not math.isfinite(v) and i not in bad:
                    bad[i] = f"column {n!r} is not a finite number: {cell!r}"
        return a

    x, y = values(inputs), values(targets) if targets else None
    ts = None
    if times:
        ts = np.array([timestamp(c) for c in table.columns[times[0]]])
        for i in np.flatnonzero(~np.isfinite(ts)):
            bad.setdefault(int(i), f"time column {times[0]!r} is not a number or ISO date-time: "
                                   f"{table.columns[times[0]][i]!r}")
    return Rows(inputs, targets, x, y, ts, dict(sorted(bad.items())), chosen.note)


# ---- pacing and progress ------------------------------------------------------------------------
class Pacer:
    """When to send: ``rate`` rows per second, or the file's own time steps (``realtime``), or
    at once. A late row goes at once: the schedule keeps its start, so a replay slowed down
    (by the engine's first, compiling step, say) catches up."""

    def __init__(self, rate: float | None = None, realtime: bool = False):
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise ReplayError(f"--rate must be a positive number of rows per second; got {rate}")
        self.rate, self.realtime, self.t0, self.ts0 = rate, realtime, None, None

    def wait(self, k: int, ts: float | None):
        now = time.perf_counter()
        if self.t0 is None:
            self.t0, self.ts0 = now, ts
            return
        if self.rate:
            due = self.t0 + k / self.rate
        elif self.realtime:
            due = self.t0 + (ts - self.ts0)
        else:
            return
        if due > now:
            time.sleep(due - now)


class ProgressBar:
    """One redrawn line on a terminal, a line every few seconds otherwise (logs stay short)."""

    def __init__(self, total: int, stream=None, enabled: bool = True):
        stream = stream or sys.stderr
        self.total, self.stream, self.enabled = total, stream, enabled
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.every = 0.1 if self.tty else 5.0
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, refused: int, bad: int, final: bool = False):
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.every and not final):
            return
        self.last = now
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        rate = done / max(now - self.start, 1e-9)
        line = f"  replay [{bar}] {done}/{self.total} rows  {rate:,.0f} rows/s  refused {refused}  bad {bad}"
        self.stream.write(("\r" + line + ("\n" if final else "")) if self.tty else line + "\n")
        self.stream.flush()


# ---- the replay ----------------------------------------------------------------------------------
@dataclass
class ReplayResult:
    file: str
    stream: str
    mode: str                                  # "forecast" or "supervised"
    inputs: list[str]
    targets: list[str]
    rows: int
    sent: int
    answered: int
    bad_rows: dict[int, str]                   # row index -> reason (where: ``Table.where``)
    refused: Counter
    seconds: float
    rows_answered: np.ndarray = field(repr=False, default=None)   # row index of every answer
    predictions: np.ndarray = field(repr=False, default=None)     # (answered, n_out), in order
    scored_predictions: np.ndarray = field(repr=False, default=None)
    scored_targets: np.ndarray = field(repr=False, default=None)
    nrmse: float = math.nan
    mae: float = math.nan
    persistence_nrmse: float = math.nan
    nrmse_all: float = math.nan                 # over every scored step (nrmse: the last ``window``)
    note: str = ""                              # why metrics are missing, when they are
    channels: list | None = None                # forecast: the inputs (by position) the engine predicts
    events: Counter = field(default_factory=Counter)   # answers flagged outlier / rolled_back (the screen)
    flagged: np.ndarray = field(repr=False, default=None)   # per answer: its row held an outlier
    leads: object = None                        # with --horizon: streamtrace.evaluation.leads.LeadScores

    def summary(self) -> dict:
        """The one-line JSON ``replay`` prints: counts, and the scores (with ``--horizon``,
        ``scored`` counts the forecast origins, ``nrmse`` / ``persistence_nrmse`` are lead 1's
        and ``leads`` holds every lead's)."""
        clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731
        head = {"file": self.file, "stream": self.stream, "mode": self.mode, "rows": self.rows, "sent": self.sent,
                "steps": self.answered}
        tail = {"bad_rows": len(self.bad_rows), "refused": dict(self.refused), "outliers": self.events["outlier"],
                "rolled_back": self.events["rolled_back"], "seconds": round(self.seconds, 3)}
        if self.leads is not None:
            s = self.leads
            return head | {"scored": s.origins[1] - s.origins[0], "nrmse": clean(s.nrmse[0]),
                           "persistence_nrmse": clean(s.persistence[0])} | tail | \
                {"leads": {"nrmse": s.nrmse, "persistence": s.persistence, "seasonal": s.seasonal, "period": s.period}}
        return head | {"scored": 0 if self.scored_targets is None else len(self.scored_targets),
                       "nrmse": clean(self.nrmse), "mae": clean(self.mae),
                       "persistence_nrmse": clean(self.persistence_nrmse), "nrmse_all": clean(self.nrmse_all)} | tail


def _score(result: ReplayResult, rows: Rows, window: int):
    """Prequential metrics from the answers: pairs of (prediction, what it predicted)."""
    from streamtrace.evaluation.scoring import mae, nrmse
    idx, p = result.rows_answered, result.predictions
    if len(idx) < 3:
        result.note = "fewer than 3 answered rows: nothing to score"
        return
    if result.mode == "forecast":      # answer j predicts the next answered row's inputs (or its channels)
        cols = result.channels or slice(None)
        pred, target, last = p[:-1], rows.x[idx[1:]][:, cols], rows.x[idx[:-1]][:, cols]
    else:                              # answer j predicts row j's targets; persistence: row j-1's
        pred, target, last = p[1:], rows.y[idx[1:]], rows.y[idx[:-1]]
    if result.flagged is not None and result.flagged.any():
        # a row the engine screened as an outlier is a glitch, not a target: as the engine's own
        # metrics, neither it nor persistence from it is scored
        keep = ~(result.flagged[1:] | result.flagged[:-1])
        pred, target, last = pred[keep], target[keep], last[keep]
    if pred.shape[1] != target.shape[1]:
        result.note = (f"the engine predicts {pred.shape[1]} values, the rows have {target.shape[1]} "
                       f"{'inputs' if result.mode == 'forecast' else 'targets'}: not scored" +
                       (" (a forecast of some inputs: give them with --channels)" if result.mode == "forecast" else ""))
        return
    w = window if 0 < window < len(target) else len(target)
    result.scored_predictions, result.scored_targets = pred[-w:], target[-w:]
    result.mae = mae(pred, target, w)
    try:
        result.nrmse, result.persistence_nrmse = nrmse(pred, target, w), nrmse(last, target, w)
        result.nrmse_all = nrmse(pred, target, len(target))
    except ValueError as e:            # a constant target: NRMSE is undefined, MAE still stands
        result.note = str(e)


def replay(path: str | Path, endpoint: str = DEFAULT_ENDPOINT, *, stream: str | None = None, columns=None,
           target_columns=None, time_column: str | None = None, rate: float | None = None,
           realtime: bool = False, window: int = 1000, timeout_s: float = 60.0, progress: bool = False,
           nats: str | None = None, creds=None, channels=None, units: FileUnits | None = None,
           horizon: int = 1, period: int = 0) -> ReplayResult:
    """Send every good row of ``path`` to the engine at ``endpoint`` and score its answers.
    With ``target_columns`` the rows carry ``y`` (the engine must be in supervised mode).
    ``channels``: the input columns (positions among the inputs) a forecast engine predicts, its
    ``learning.channels`` (None: all of them).
    With ``nats`` (a URL), to a cluster through NATS instead (streamtrace[cluster]; ``creds``:
    its ``Credentials``). With ``units`` (:class:`FileUnits`), the file's rate is checked and its
    inputs converted into the engine's declared ``[stream]`` (inputs, predictions and scores are
    then in those units). With ``horizon`` H > 1 (the engine's ``learning.horizon``) each lead is
    scored (``result.leads``) beside persistence and, with ``period``, the seasonal naive forecast."""
    if rate is not None and realtime:
        raise ReplayError("choose one of --rate and --realtime")
    if realtime and not time_column:
        raise ReplayError("--realtime paces by the timestamps: name the column with --time-column")
    pacer = Pacer(rate, realtime)
    table = read_table(path)
    rows = select_rows(table, columns, target_columns, time_column)
    if units is not None:
        rows.x = units.apply(rows)
    channels = _channels(channels, rows)
    if progress and rows.note:      # said before the replay starts, where the progress goes
        print(f"replay: {rows.note}", file=sys.stderr, flush=True)
    stream = stream or Path(path).stem[:128] or "replay"
    mode = "supervised" if rows.targets else "forecast"
    good = [i for i in range(len(table)) if i not in rows.bad]
    bar = ProgressBar(len(table), enabled=progress)
    refused, answered, preds, events, flagged = Counter(), [], [], Counter(), []
    t0 = time.perf_counter()
    if nats:
        from streamtrace.cluster.client import ClusterClient
        endpoint = nats
    with (ClusterClient(nats, stream=stream, timeout_s=timeout_s, creds=creds) if nats else
          SensorClient(endpoint, stream=stream, timeout_s=timeout_s)) as client:
        for k, i in enumerate(good):
            pacer.wait(k, None if rows.ts is None else rows.ts[i])
            y = None if rows.y is None else rows.y[i]
            try:                       # a gap/repeat reply is resynced by the client: the row goes again
                reply = client.step(rows.x[i], y)
            except EngineError as e:
                if not answered and e.code in ("bad_shape", "bad_dtype"):
                    raise ReplayError(f"the engine refused the first row: {e} (do --columns / "
                                      f"--target match the model's inputs and outputs?)") from None
                refused[e.code] += 1
            except TimeoutError:
                raise ReplayError(f"no answer from an engine at {endpoint} within {timeout_s:g} s: is it "
                                  "running there (or give --serve CONFIG)?") from None
            else:
                answered.append(i)
                preds.append(np.asarray(reply.pred, np.float64).reshape(-1))
                got = [k for k in ("outlier", "rolled_back") if isinstance(reply, dict) and reply.get(k)]
                events.update(got)
                flagged.append("outlier" in got)
            bar(i + 1, sum(refused.values()), len(rows.bad))
    bar(len(table), sum(refused.values()), len(rows.bad), final=True)
    n_out = preds[0].size if preds else 0
    result = ReplayResult(str(path), stream, mode, rows.inputs, rows.targets, len(table), len(good), len(answered),
                          {i: f"{table.where[i]}: {why}" for i, why in rows.bad.items()}, refused,
                          time.perf_counter() - t0, np.array(answered, int),
                          np.array(preds, np.float64).reshape(len(preds), n_out))
    result.channels, result.events, result.flagged = channels, events, np.array(flagged, bool)
    if horizon > 1:
        score_replay_leads(result, rows, horizon, window, period)
    else:
        _score(result, rows, window)
    return result


def _channels(channels, rows: Rows) -> list | None:
    if not channels:
        return None
    if rows.targets:
        raise ReplayError("--channels chooses what a forecast predicts: not with --target")
    if len(set(channels)) != len(channels) or not all(0 <= c < len(rows.inputs) for c in channels):
        raise ReplayError(f"--channels {channels}: need distinct positions among the {len(rows.inputs)} inputs "
                          f"{rows.inputs} (0..{len(rows.inputs) - 1})")
    return list(channels)


@dataclass
class FileUnits:
    """A replayed file's input units (one per input column; [] or "": not said) against the
    ``[stream]`` the engine's config declares (a ``StreamConfig``): ``apply`` checks the time
    column's rate (its median step, within 1 %) and returns the inputs in the declared units.

    >>> from streamtrace.engine.config import StreamConfig
    >>> rows = Rows(["a"], [], np.array([[1500.0], [250.0]]), None, np.array([0.0, 0.004]), {})
    >>> FileUnits(["uV"], StreamConfig(rate=250.0, units=["mV"])).apply(rows).tolist()
    [[1.5], [0.25]]
    """
    units: list
    declared: object

    RATE_TOLERANCE = 0.01       # a recording's clock jitters: its median step within 1 %

    def apply(self, rows: Rows) -> np.ndarray:
        from streamtrace.units import UnitError
        from .stream_units import conform
        rate = 0.0
        if rows.ts is not None:
            steps = np.diff(rows.ts[np.isfinite(rows.ts)])
            rate = 1.0 / float(np.median(steps)) if len(steps) and np.median(steps) > 0 else 0.0
        if self.units and len(self.units) != len(rows.inputs):
            raise ReplayError(f"--units names {len(self.units)} units for {len(rows.inputs)} input columns "
                              f"{rows.inputs}")
        try:
            c = conform(rate, self.units, declared_rate=self.declared.rate, declared_units=self.declared.units,
                        what="the file", tolerance=self.RATE_TOLERANCE)
        except UnitError as e:
            raise ReplayError(str(e)) from None
        return c.apply(rows.x)


# ---- command line --------------------------------------------------------------------------------
def _engine_config(path: str) -> tuple[str, str, list]:
    """The router address, learning mode and forecast channels a config file gives the engine
    (checked as the engine checks it, so that a bad config is one line here, not the engine's exit)."""
    from streamtrace.engine.config import ConfigError, load_config
    try:
        cfg = load_config(path)
    except ConfigError as e:
        raise ReplayError(f"--serve {path}: " + " ".join(str(e).removeprefix(f"--config: {path}: ").split())) from None
    return cfg.sockets.router, cfg.learning.mode, list(cfg.learning.channels)


def _file_units(args) -> FileUnits | None:
    """--units against the [stream] of --serve's config (its rate checked too, with a time column)."""
    from streamtrace.engine.config import ConfigError

    from .stream_units import declared_stream
    if args.units and not args.serve:
        raise ReplayError("--units converts the file into the [stream] units of an engine's config: give --serve "
                          "CONFIG")
    if not args.serve:
        return None
    try:
        declared = declared_stream(args.serve)
    except ConfigError as e:
        raise ReplayError(f"--serve {args.serve}: {e}") from None
    return FileUnits([u.strip() for u in args.units.split(",")] if args.units else [], declared)


def _report(r: ReplayResult) -> str:
    columns = "inputs " + ",".join(r.inputs) + ("; targets " + ",".join(r.targets) if r.targets else "")
    lines = [f"replay {r.file} -> stream {r.stream!r} ({r.mode}; {columns}) in {r.seconds:.2f} s",
             f"rows {r.rows}  sent {r.sent}  answered {r.answered}  bad rows {len(r.bad_rows)}  "
             f"refused {sum(r.refused.values())}" +
             (" (" + ", ".join(f"{c} {n}" for c, n in sorted(r.refused.items())) + ")" if r.refused else "")]
    if r.events:
        lines.append(f"screened: {r.events['outlier']} steps with an outlier (not learnt from, not scored here "
                     f"either), "
                     f"{r.events['rolled_back']} rolled back")
    for why in list(r.bad_rows.values())[:SHOWN_BAD_ROWS]:
        lines.append(f"  bad row, {why}")
    if len(r.bad_rows) > SHOWN_BAD_ROWS:
        lines.append(f"  ... and {len(r.bad_rows) - SHOWN_BAD_ROWS} more bad rows")
    if r.scored_targets is not None:
        n, total = len(r.scored_targets), len(r.predictions) - 1
        over = f"the last {n} of {total} steps (as evaluate scores)" if n < total else f"{n} steps"
        lines.append(f"prequential over {over}: NRMSE {r.nrmse:.5g}  MAE {r.mae:.5g}  "
                     f"persistence NRMSE {r.persistence_nrmse:.5g}")
        if n < total:       # the whole run, learning from scratch included
            lines.append(f"prequential over all {total} steps: NRMSE {r.nrmse_all:.5g}")
    if r.leads is not None:
        lines.append(format_leads(r.leads))
    if r.note:
        lines.append("note: " + r.note)
    return "\n".join(lines)


def write_predictions(r: ReplayResult, path: str | Path):
    """Every answer: the data row it answers (0-based, header not counted) and the prediction,
    as CSV (full float precision) or, for a .npy path, an array with the row in column 0."""
    table = np.column_stack([r.rows_answered, r.predictions]) if r.answered else np.zeros((0, 1))
    if str(path).lower().endswith(".npy"):
        np.save(path, table)
        return
    names = ([r.inputs[c] for c in r.channels] if r.channels else r.inputs) if r.mode == "forecast" else r.targets
    if len(names) != r.predictions.shape[1]:
        names = [str(j) for j in range(r.predictions.shape[1])]
    header = ",".join(["row"] + [f"pred_{n}" for n in names])
    np.savetxt(path, table, delimiter=",", header=header, comments="",
               fmt=["%d"] + ["%.17g"] * r.predictions.shape[1])


def run_cli(args) -> int:
    """``streamtrace replay``: a report, then one JSON line (the last line of stdout)."""
    from streamtrace.cluster.cli import credentials, stray_credential
    from streamtrace.engine.launch import start_engine, stop
    engine = None
    try:
        if stray_credential(args):
            raise ReplayError(f"{stray_credential(args)} is a NATS option: it needs --nats URL")
        endpoint, channels = args.endpoint or DEFAULT_ENDPOINT, args.channels
        units = _file_units(args)      # refused before an engine starts
        if args.serve:
            router, mode, served = _engine_config(args.serve)
            channels = channels or served
            endpoint = args.endpoint or router
            if (mode == "supervised") != bool(args.target_columns):
                raise ReplayError(f"--serve {args.serve} has learning.mode = {mode!r}: " +
                                  ("give its targets with --target" if mode == "supervised" else
                                   "--target needs learning.mode = 'supervised'"))
            read_table(args.file)      # a bad file fails before an engine is started
            try:
                engine = start_engine(Path(args.serve))
            except RuntimeError as e:
                raise ReplayError(f"--serve {args.serve}: {e}") from None
        r = replay(args.file, endpoint, stream=args.stream, columns=files.split_names(args.columns),
                   target_columns=files.split_names(args.target_columns), time_column=args.time_column, rate=args.rate,
                   realtime=args.realtime, window=args.window, timeout_s=args.timeout, progress=True,
                   nats=args.nats, creds=credentials(args) if args.nats else None, channels=channels,
                   units=units, horizon=args.horizon, period=args.period)
    except (ReplayError, ConnectionError) as e:      # ConnectionError: a NATS server refused or absent
        print(f"replay: {e}", file=sys.stderr)
        return 2
    finally:
        if engine is not None:
            stop(engine)
            engine.stdout.close()
    print(_report(r))
    if args.out:
        write_predictions(r, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.plot:
        if r.scored_targets is None:
            print(f"replay: no plot, nothing was scored ({r.note})", file=sys.stderr)
        else:
            from streamtrace.evaluation.scoring import Result, plot
            plot(Result(Path(r.file).name, len(r.scored_targets), len(r.scored_targets), r.nrmse, r.mae, math.nan,
                        r.persistence_nrmse, label=f"replay ({r.mode})", predictions=r.scored_predictions,
                        targets=r.scored_targets), args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
    print(json.dumps(r.summary()), flush=True)
    return 0 if r.answered else 1
