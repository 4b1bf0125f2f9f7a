"""Prequential evaluation: predict first, score, then learn, one step at a time.

At step t a learner receives ``inputs[t]`` and returns its prediction of ``targets[t]``; that
prediction is recorded before the learner can learn from ``targets[t]``. Forecast tasks
(``targets[t] = inputs[t + 1]``) give the learner only ``inputs[t]``, so the value it predicts
reaches it one call later; supervised tasks hand over ``targets[t]`` in the same call, and the
learner must predict with its pre-update weights (``OnlineLearner`` does).

Scores are over the last ``window`` steps (half the stream when it is not longer than that), or
over the task's own span (``Task.score``, e.g. just after a change): NRMSE = RMSE / std(target)
per channel, averaged over channels; MAE in the target's units; us/step = wall time of the step
calls / steps (the first call, which compiles, is left out); persistence (predict the last target)
on the same steps for scale. A task's further named spans (``Task.spans``) get their NRMSE, and
persistence's, in ``Result.spans`` / ``Result.persistence_spans``.
"""
from __future__ import annotations

import copy
import json
import math
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .tasks import Task, get_task

__all__ = ["Result", "prequential", "nrmse", "mae", "persistence", "default_config", "task_config",
           "config_data", "with_channels", "evaluate", "learner_step_fn", "format_table", "summary_json", "plot"]

StepFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class Result:
    task: str
    steps: int
    window: int
    nrmse: float
    mae: float
    us_per_step: float
    persistence_nrmse: float
    label: str = ""
    us_median_step: float = float("nan")   # robust to a busy machine's stalls
    score: tuple[int, int] | None = None     # the steps [start, stop) scored: the last window or the task's span
    screened: int = 0                        # steps the learner screened as outliers (their rows not scored)
    spans: dict[str, float] = field(default_factory=dict)              # NRMSE per named span
    persistence_spans: dict[str, float] = field(default_factory=dict)  # persistence's, on the same spans
    predictions: np.ndarray = field(default=None, repr=False)
    targets: np.ndarray = field(default=None, repr=False)


# ---- metrics ------------------------------------------------------------------------------
def _window(a, window):
    a = np.asarray(a, np.float64)
    return (a[:, None] if a.ndim == 1 else a.reshape(len(a), -1))[-window:]


def nrmse(pred, target, window: int | None = None) -> float:
    """RMSE / std(target) per channel over the last ``window`` steps, averaged over channels."""
    p, y = _window(pred, window or len(pred)), _window(target, window or len(target))
    if p.shape != y.shape:
        raise ValueError(f"predictions {p.shape} and targets {y.shape} differ in shape")
    std = y.std(0)
    if np.any(std == 0):
        raise ValueError("a target channel is constant over the window: NRMSE is undefined")
    return float(np.mean(np.sqrt(np.mean((p - y) ** 2, 0)) / std))


def mae(pred, target, window: int | None = None) -> float:
    p, y = _window(pred, window or len(pred)), _window(target, window or len(target))
    return float(np.mean(np.abs(p - y)))


def persistence(task: Task) -> np.ndarray:
    """Predict the last target seen: ``targets[t - 1]`` (for forecasts that is ``inputs[t]``)."""
    pred = np.empty_like(task.targets)
    pred[1:] = task.targets[:-1]
    same = task.mode == "forecast" and task.inputs.shape[1:] == task.targets.shape[1:]
    pred[0] = task.inputs[0] if same else 0.0     # a forecast of some channels: nothing seen yet
    return pred


# ---- the loop -----------------------------------------------------------------------------
def _effective_window(window: int, steps: int) -> int:
    if window < 1:
        raise ValueError(f"window must be >= 1; got {window}")
    return window if window < steps else max(steps // 2, 1)   # a series too short: its second half


def _check_span(label: str, span, steps: int) -> tuple[int, int]:
    try:
        start, stop = (int(v) for v in span)
    except (TypeError, ValueError):
        raise ValueError(f"span {label!r} must be (start, stop); got {span!r}") from None
    if not 0 <= start < stop <= steps:
        raise ValueError(f"span {label!r} = ({start}, {stop}) is not within the {steps} steps "
                         f"(0 <= start < stop <= {steps})")
    return start, stop


def prequential(step_fn: StepFn, inputs, targets=None, *, window: int = 1000, name: str = "",
                mode: str = "forecast", progress: Callable[[int, int], None] | None = None,
                score: tuple[int, int] | None = None, spans: dict[str, tuple[int, int]] | None = None) -> Result:
    """Run ``step_fn(x_t, y_t) -> prediction of y_t`` over the stream and score it. Without
    ``targets``, ``inputs`` is one series forecast one step ahead. ``score`` = (start, stop)
    scores steps start..stop-1 instead of the last ``window``; ``spans`` names further
    (start, stop) spans to report in ``Result.spans``.

    The contract for ``step_fn``: return the prediction made *before* learning from ``y_t``
    (a forecaster ignores ``y_t``: it arrives as the next input). Any learner fits, e.g. a
    reservoirpy or river model wrapped as predict-then-learn. It may also return
    ``(prediction, screened)``: ``screened`` true when the learner found the step's sample an
    outlier (a glitch, ``learner/screen.py``); then the row whose target is that sample is not
    scored, nor persistence from it (as ``serve``'s metrics and ``replay`` leave them out), and
    ``Result.screened`` counts them."""
    if targets is None:
        series = np.asarray(inputs)
        inputs, targets, mode = series[:-1], series[1:], "forecast"
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    if len(inputs) != len(targets) or len(inputs) < 2:
        raise ValueError(f"need as many inputs as targets, at least 2; got {len(inputs)} and {len(targets)}")
    steps = len(inputs)
    if score is None:
        w = _effective_window(window, steps)
        score = (steps - w, steps)
    score = _check_span("score", score, steps)
    spans = {k: _check_span(k, v, steps) for k, v in (spans or {}).items()}   # refused before the run
    preds = np.empty(targets.shape, np.float64)
    clock = time.perf_counter
    times, flags = np.empty(steps), np.zeros(steps, bool)
    for t in range(steps):
        x, y = inputs[t], targets[t]
        t0 = clock()
        p = step_fn(x, y)
        times[t] = clock() - t0
        if isinstance(p, tuple):
            p, flags[t] = p[0], bool(p[1])
        preds[t] = np.reshape(p, targets.shape[1:])
        if progress is not None:
            progress(t + 1, steps)
    naive = persistence(Task(name, mode, inputs, targets))
    run_times = times[1:]           # the first call compiles / allocates: not a step's cost
    keep = ~_glitch_rows(flags, mode)
    kept = lambda a, s, e: a[s:e][keep[s:e]]        # noqa: E731
    a, b = score
    return Result(name, steps, b - a, nrmse(kept(preds, a, b), kept(targets, a, b)),
                  mae(kept(preds, a, b), kept(targets, a, b)), float(run_times.mean() * 1e6),
                  nrmse(kept(naive, a, b), kept(targets, a, b)),
                  us_median_step=float(np.median(run_times) * 1e6), predictions=preds, targets=targets,
                  score=score, screened=int(flags.sum()),
                  spans={k: nrmse(kept(preds, s, e), kept(targets, s, e)) for k, (s, e) in spans.items()},
                  persistence_spans={k: nrmse(kept(naive, s, e), kept(targets, s, e)) for k, (s, e) in spans.items()})


def _glitch_rows(flags: np.ndarray, mode: str) -> np.ndarray:
    """The rows not scored for the screened steps ``flags``: the row whose target is the
    screened sample (forecast: the row before, whose target is this input; supervised: the row
    itself) and the next one (persistence predicts it from the glitch).

    >>> _glitch_rows(np.array([False, False, True, False]), "forecast").tolist()
    [False, True, True, False]
    >>> _glitch_rows(np.array([False, True, False, False]), "supervised").tolist()
    [False, True, True, False]
    """
    bad = flags.copy()
    if mode == "forecast":
        bad[:-1] |= flags[1:]
    else:
        bad[1:] |= flags[:-1]
    return bad


# ---- streamtrace learners -----------------------------------------------------------------
def default_config(task: Task) -> dict:
    """The documented default learner (``recipe.DEFAULT_LEARNER``, what ``serve`` runs
    when its config names no model) as a TOML-equivalent dict for ``task``: the task decides
    n_in / n_out / mode."""
    from ..recipe.defaults import DEFAULT_LEARNER
    data = {section: dict(values) for section, values in DEFAULT_LEARNER.items()}
    data["model"].update(n_in=task.n_in, n_out=task.n_out)
    data["transform"]["residual"] = task.mode == "forecast"
    data["learning"]["mode"] = task.mode
    return data


def config_data(task: Task, config: dict | str | Path | None = None) -> dict:
    """The config as a TOML-equivalent dict: a copy of ``config``, the TOML file it names, or
    :func:`default_config` for ``task`` when None.

    Example: ``config_data(get_task("narma10", 50))["learning"]["mode"]`` is "supervised"."""
    from ..engine.config import ConfigError
    if config is None:
        return default_config(task)
    if isinstance(config, dict):
        return copy.deepcopy(config)
    try:
        return tomllib.loads(Path(config).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {config} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{config}: invalid TOML: {e}") from None


def with_channels(task: Task, data: dict) -> Task:
    """``task`` predicting only the config's ``learning.channels`` (a forecast of some input
    channels, the rest exogenous); unchanged when the config names none.

    Example: a two-column forecast with ``{"learning": {"channels": [1]}}`` has ``n_out`` 1."""
    from ..engine.config import ConfigError
    from .tasks import TaskError
    channels = data.get("learning", {}).get("channels")
    if not channels:
        return task
    try:
        return task.forecasting(channels)
    except TaskError as e:
        raise ConfigError(str(e)) from None


def task_config(task: Task, config: dict | str | Path | None = None, seed: int | None = None):
    """An ``EngineConfig`` for ``task``: the given config (a TOML path or its dict) or the
    default, with model.n_in / n_out and learning.mode filled from the task where not set.
    Set but inconsistent values are refused with the reason. (A config naming
    ``learning.channels`` fits the task :func:`with_channels` makes.)"""
    from ..engine.config import ConfigError, load_config
    data = config_data(task, config)
    model, learning = data.setdefault("model", {}), data.setdefault("learning", {})
    want = {("model", "n_in"): task.n_in, ("model", "n_out"): task.n_out, ("learning", "mode"): task.mode}
    for (section, key), value in want.items():
        table = model if section == "model" else learning
        if table.setdefault(key, value) != value:
            raise ConfigError(f"{section}.{key} = {table[key]!r} does not fit task {task.name!r} "
                              f"({task.mode}, {task.n_in} input(s), {task.n_out} output(s)): "
                              f"leave it out or set {value!r}")
    if seed is not None:
        model.setdefault("seed", seed)
    return load_config(None, overrides=data)


def learner_step_fn(learner, mode: str) -> StepFn:
    """Wrap an ``OnlineLearner`` as a prequential step: forecast mode learns from x_t (the
    target of its last prediction) and predicts x_{t+1}; supervised mode predicts y_t with
    the pre-update weights and then learns from it. Returns (prediction, screened): whether
    the screen found the step's sample an outlier."""
    dtype = learner.x_dtype
    if mode == "forecast":
        step = lambda x, y: learner.step(np.asarray(x, dtype))      # noqa: E731
    else:
        step = lambda x, y: learner.step(np.asarray(x, dtype), np.asarray(y, learner.y_dtype))  # noqa: E731

    def scored(x, y):
        r = step(x, y)
        return r.prediction, bool(np.any(r.outlier))
    return scored


def evaluate(task: Task | str, config: dict | str | Path | None = None, *, steps: int | None = None,
             window: int = 1000, seed: int = 0, label: str = "", progress=None) -> Result:
    """Prequential evaluation of a streamtrace config (built by ``recipe.build_learner``),
    scored on the task's own spans where it has them. ``steps``: None is the task's default."""
    from ..recipe.build import build_learner
    if isinstance(task, str):
        task = get_task(task, steps, seed)
    data = config_data(task, config)
    task = with_channels(task, data)
    cfg = task_config(task, data, seed)
    learner = build_learner(cfg)
    r = prequential(learner_step_fn(learner, task.mode), task.inputs, task.targets, window=window,
                    name=task.name, mode=task.mode, progress=progress, score=task.score, spans=task.spans)
    r.label = label or f"{cfg.model.stack}-{cfg.model.n_hidden} {cfg.learning.algorithm}"
    return r


# ---- reporting ----------------------------------------------------------------------------
def format_table(results: list[Result]) -> str:
    head = ("task", "config", "steps", "window", "nrmse", "mae", "us/step", "persistence nrmse")
    rows = [(r.task, r.label, str(r.steps), str(r.window), f"{r.nrmse:.5g}", f"{r.mae:.5g}",
             f"{r.us_per_step:.1f}", f"{r.persistence_nrmse:.5g}") for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    notes = [f"{r.task} {k}: nrmse {v:.5g}, persistence nrmse {r.persistence_spans.get(k, math.nan):.5g}"
             for r in results for k, v in r.spans.items()]
    notes += [f"{r.task}: {r.screened} step(s) screened as outliers (glitches): their rows not scored"
              for r in results if r.screened]
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows] + notes)


def summary_json(r: Result) -> str:
    out = {"task": r.task, "nrmse": r.nrmse, "mae": r.mae, "us_per_step": r.us_per_step, "steps": r.steps}
    if r.spans:                      # only tasks that name spans: the plain summary keeps its keys
        out["spans"] = r.spans
    return json.dumps(out)


def plot(r: Result, path: str | Path, last: int = 500):
    """Prediction against target (first channel) over the last steps, and the running error."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    p, y = _window(r.predictions, len(r.predictions)), _window(r.targets, len(r.targets))
    n = min(last, len(y))
    t = np.arange(len(y) - n, len(y))
    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 6))
    a.plot(t, y[-n:, 0], label="target", lw=1.2)
    a.plot(t, p[-n:, 0], label="prediction (made before the target arrived)", lw=1.0, ls="--")
    own = r.score is not None and r.score[1] != r.steps        # a task's own span, not the last window
    scored = f"steps {r.score[0]}..{r.score[1] - 1}" if own else f"last {r.window} steps"
    a.set_title(f"{r.task}: {r.label}  NRMSE {r.nrmse:.4g} ({scored})")
    a.legend(loc="upper right")
    err = np.sqrt(np.convolve(((p - y) ** 2).mean(1), np.ones(100) / 100, mode="valid"))
    b.semilogy(np.arange(len(err)) + 99, err)
    b.set_xlabel("step")
    b.set_ylabel("RMSE (100-step mean)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class Progress:
    """Progress on stderr for long runs (at most every 2 s)."""

    def __init__(self, label: str, stream=sys.stderr, every_s: float = 2.0):
        self.label, self.stream, self.every_s = label, stream, every_s
        self.last = time.monotonic()

    def __call__(self, done: int, total: int):
        now = time.monotonic()
        if now - self.last >= self.every_s or done == total:
            self.last = now
            print(f"  {self.label}: step {done}/{total}", file=self.stream, flush=True)


def run_cli(args) -> int:
    """``streamtrace evaluate``: the table, then one JSON line (the last line of stdout)."""
    from ..engine.config import ConfigError
    from .files import split_names
    from ..learner.dispatch import inline_dispatch
    from .tasks import TaskError
    inline_dispatch()       # each step is awaited at once: no hand-off to jax's worker thread
    try:
        task = get_task(args.task, args.steps, args.seed, columns=split_names(args.columns),
                        target=split_names(args.target), time_column=args.time_column)
        if task.note:
            print(f"evaluate: {task.note}", file=sys.stderr, flush=True)
        r = evaluate(task, args.config, window=args.window, seed=args.seed,
                     label="" if args.config else "default", progress=Progress(task.name))
    except (TaskError, ConfigError, ValueError) as e:
        print(f"evaluate: {e}", file=sys.stderr)
        return 2
    if args.plot:
        plot(r, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    print(format_table([r]))
    print(summary_json(r), flush=True)
    return 0
