"""Learning-quality benchmark (`make quality`): the prequential protocol of ``streamtrace evaluate``
(predict first, score, then learn; one step ahead; NRMSE = RMSE / std(target) over the last
1,000 of 6,000 steps) for streamtrace configs and, side by side in the same run, reservoirpy's
ESN + online RLS readout, river (SNARIMAX, lagged regressions), a plain jitted ESN + RLS step in
jax (the cost floor) and persistence. Median of 3 seeds; a peer's grid reports its best entry
(chosen on the scored window itself: generous to the peer). Writes bench/results/quality.md
and quality.json.

    python bench/quality.py [--quick] [--tasks mackey-glass narma10] [--only streamtrace]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from quality_peers import (jax_esn_rls, jax_esn_rls_step_us, reservoirpy_esn, river_lagged,  # noqa: E402
                           river_snarimax)

from streamtrace.evaluation.scoring import default_config, evaluate, prequential  # noqa: E402
from streamtrace.evaluation.tasks import Task, TaskError, get_task  # noqa: E402

# ---- streamtrace configs: TOML-equivalent dicts; model.n_in / n_out / learning.mode come from the
# task. Add new configs here (any key `serve` accepts); None = evaluate.default_config(task).
_RES = {"stack": "reservoir", "precision": 64}
_FROZEN_RLS = {"readout": {"kind": "rls"}, "learning": {"optimizer": "frozen"}}
CONFIGS = {
    # the documented default (recipe.DEFAULT_LEARNER): 200-unit float64 reservoir,
    # normalise + residual, RLS (two ridges), mixed with persistence and a running mean (experts)
    "default": None,
    "default without experts": {"combine": {"experts": False}},
    # targets as inputs (supervised): the last target fed back to an 800-unit reservoir
    "reservoir-800 narma feedback": {"model": {**_RES, "n_hidden": 800},
                                     "reservoir": {"input_scaling": 0.05, "spectral_radius": 0.95},
                                     "transform": {"feedback": 1}, "readout": {"kind": "rls", "delta": 1e-8},
                                     "learning": {"optimizer": "frozen"}},
    "reservoir-300": {"model": {**_RES, "n_hidden": 300}, "transform": {"normalise": True, "residual": True},
                      **_FROZEN_RLS},
    # reservoirpy's best size on Mackey-Glass, one ridge
    "reservoir-500": {"model": {**_RES, "n_hidden": 500}, "transform": {"normalise": True, "residual": True},
                      "readout": {"kind": "rls", "delta": 1e-8}, "learning": {"optimizer": "frozen"}},
    # tuned for NARMA-10 (small input scaling on the raw u in [0, 0.5], radius 0.95): supervised
    "reservoir-300 narma": {"model": {**_RES, "n_hidden": 300},
                            "reservoir": {"input_scaling": 0.05, "spectral_radius": 0.95},
                            "readout": {"kind": "rls", "delta": 1e-8}, "learning": {"optimizer": "frozen"}},
    # the hybrid: the same 200-unit reservoir, its weights learning through D-RTRL traces from
    # the RLS readout's error, beside the fixed one (default)
    "hybrid-200 d-rtrl": {"model": {**_RES, "n_hidden": 200}, "transform": {"normalise": True, "residual": True},
                          "readout": {"kind": "rls"}, "learning": {"algorithm": "d-rtrl", "optimizer": "sgd",
                                                                   "lr": 1e-4}},
    "gru-32 d-rtrl norm+res": {"model": {"stack": "gru", "n_hidden": 32},
                               "transform": {"normalise": True, "residual": True},
                               "learning": {"algorithm": "d-rtrl", "lr": 1e-3}},
    "gru-32 d-rtrl (raw)": {"model": {"stack": "gru", "n_hidden": 32},
                            "learning": {"algorithm": "d-rtrl", "lr": 1e-3}},
    "lif-256 d-rtrl norm": {"model": {"factory": "quality_models:lif256"}, "transform": {"normalise": True},
                            "learning": {"algorithm": "d-rtrl", "lr": 3e-4}},
    "alif-256 d-rtrl norm": {"model": {"factory": "quality_models:alif256"}, "transform": {"normalise": True},
                             "learning": {"algorithm": "d-rtrl", "lr": 3e-4}},
    # the default is the hybrid: its fixed reservoir beside a GRU-16 whose weights learn through
    # D-RTRL traces from the readout's error (nn.Beside, [learned]). Against it: the reservoir alone
    # (the default before, no trace learning), the same GRU left at its random weights (what
    # learning adds over 16 more random features), and reservoirs alone of 240 units (about the
    # hybrid's step time: the fixed reservoir of equal cost) and 300 units
    "reservoir alone": lambda t: _with(default_config(t), learned={"stack": ""}),
    # the default detects seasons in 2..59 steps ([combine] max_period = 60); without it, as before
    "default without seasons": lambda t: _with(default_config(t), combine={"max_period": 0}),
    "default, gru-16 fixed": lambda t: _with(default_config(t), learned={"optimizer": "frozen"}),
    "reservoir-240 alone": lambda t: _with(default_config(t), model={"n_hidden": 240}, learned={"stack": ""}),
    "reservoir-300 alone": lambda t: _with(default_config(t), model={"n_hidden": 300}, learned={"stack": ""}),
    # where learning matters, on a long stream (multichannel at 100,000 steps: the GRU's weights on
    # the 28 noise channels take longer than 25,000 steps to shrink): a GRU-32 alone under exact RTRL
    # and the RLS readout, against a frozen reservoir of at least its step time. Run only when named
    # (--configs), e.g. --tasks multichannel --steps 100000 --configs "gru-32 rtrl alone"
    # "reservoir-800 alone" "reservoir alone"
    "gru-32 rtrl alone": lambda t: _with(default_config(t), learned={"stack": ""},
                                         model={"stack": "gru", "n_hidden": 32},
                                         learning={"algorithm": "rtrl", "optimizer": "adam", "lr": 6e-4}),
    "reservoir-800 alone": lambda t: _with(default_config(t), model={"n_hidden": 800}, learned={"stack": ""}),
    # learned memory (nn.Rotations: every recurrent weight element-wise, so D-RTRL is exact RTRL):
    # 32 states alone under the RLS readout, the same frozen at their random start, and beside the
    # default's reservoir in place of its GRU-16
    "rotation-32 alone": lambda t: _with(default_config(t), learned={"stack": ""},
                                         model={"stack": "rotation", "n_hidden": 32},
                                         learning={"optimizer": "adam", "lr": 1e-3}),
    "rotation-32 alone, fixed": lambda t: _with(default_config(t), learned={"stack": ""},
                                                model={"stack": "rotation", "n_hidden": 32}),
    "default, rotation-32 beside": lambda t: _with(default_config(t), learned={"stack": "rotation", "n_hidden": 32,
                                                                              "optimizer": "adam", "lr": 1e-3}),
    # the default's readout forgets faster after a detected change (readout.change_lam 0.99); these
    # two leave it out (1.0: the readout before it), so the regime-switch gain can be split into
    # what the readout gives the reservoir alone and what trace learning adds. Run when named
    "default, no change forgetting": lambda t: _with(default_config(t), readout={"change_lam": 1.0}),
    "reservoir alone, no change forgetting": lambda t: _with(default_config(t), learned={"stack": ""},
                                                             readout={"change_lam": 1.0}),
    # small devices (issue 22): the default shrunk to a 150-unit reservoir beside a learned GRU-8
    # and one ridge (1e-8): a slot holds 0.21 MB (the reservoir's weights, 0.18 MB, are held once
    # by the engine's slot bank), against the 200-unit reservoir alone's 0.68 MB (1.00 MB before
    # fixed weights were shared). Alone: --tasks mackey-glass --configs small "reservoir alone" --only streamtrace
    "small": lambda t: _with(default_config(t), model={"n_hidden": 150}, learned={"n_hidden": 8},
                             readout={"delta": [1e-8]}),
}
ASKED: set = set()      # the configs named by --configs (a long task runs those too)


def _with(cfg: dict, **sections) -> dict:
    """``cfg`` with some sections' keys replaced."""
    return {**cfg, **{k: {**cfg.get(k, {}), **v} for k, v in sections.items()}}


# configs that only make sense on some tasks (a single-channel spiking factory, a residual forecast)
ONLY_ON = {"lif-256 d-rtrl norm": {"mackey-glass"}, "alif-256 d-rtrl norm": {"mackey-glass"},
           "reservoir-300 narma": {"narma10"}, "reservoir-800 narma feedback": {"narma10"}}
SKIP_ON = {"narma10": {"reservoir-300", "reservoir-500", "hybrid-200 d-rtrl", "gru-32 d-rtrl norm+res"}}

# the long tasks where learning should matter (25,000 steps each): the default, the hybrid and the
# fixed reservoir of equal cost; one reservoirpy ESN of the default's size and river's linear lags
LONG = ["multichannel", "regime-switch", "delay-recall"]
LONG_CONFIGS = {"default", "default without seasons", "reservoir alone", "default, gru-16 fixed", "reservoir-240 alone", "reservoir-300 alone",
                "rotation-32 alone", "rotation-32 alone, fixed", "default, rotation-32 beside"}
TASKS = ["mackey-glass", "narma10", "co2", "sunspots"] + LONG
REAL = {"co2", "sunspots"}        # measured series in raw units: peers get causal standardisation
SEEDS = [0, 1, 2]


# ---- peers and their grids ---------------------------------------------------------------------
def esn_grid(task: str, quick: bool):
    if task in LONG:
        return [dict(units=200, lr=1.0, sr=0.9, input_scaling=1.0)]
    units = 400 if task == "narma10" else 500 if task == "mackey-glass" else 200
    grid = [dict(units=units, lr=1.0, sr=0.9, input_scaling=1.0),
            dict(units=units, lr=1.0, sr=1.25, input_scaling=1.0),
            dict(units=units, lr=0.5, sr=0.9, input_scaling=1.0),
            dict(units=units, lr=1.0, sr=0.9, input_scaling=0.3)]
    if task in REAL:
        grid += [dict(units=units, lr=1.0, sr=0.9, input_scaling=1.0, forgetting=0.999)]
    return grid[:1] if quick else grid


def river_grid(task: str, quick: bool):
    if task in LONG:      # river_lagged reads one channel: not a peer for the 32-channel task
        return [] if task == "multichannel" else [("lagged", dict(lags=20, kind="linear", lr=0.01))]
    grid = []
    if task != "narma10":   # SNARIMAX forecasts a single series
        season = {"co2": 52, "sunspots": 11}.get(task)
        for p, d, q in [(4, 1, 0), (8, 1, 0), (16, 1, 0), (8, 0, 0), (8, 1, 2)]:
            grid.append(("snarimax", dict(p=p, d=d, q=q)))
        if season:
            grid.append(("snarimax", dict(p=4, d=1, q=0, m=season, sp=1, sd=1)))
    for lags in (5, 10, 20):
        grid.append(("lagged", dict(lags=lags, kind="linear", lr=0.01)))
        grid.append(("lagged", dict(lags=lags, kind="bayes")))
    grid.append(("lagged", dict(lags=10, kind="poly-bayes")))
    return grid[:1] + grid[-1:] if quick else grid


def _causal_standardise(make_step):
    """Wrap a single-channel forecaster: inputs and targets scaled by the running mean / std
    of the inputs seen so far (Welford), predictions scaled back."""
    step = make_step()
    state = {"n": 0, "mean": 0.0, "m2": 0.0}

    def fn(x, y):
        v = float(np.asarray(x).reshape(-1)[0])
        state["n"] += 1
        d = v - state["mean"]
        state["mean"] += d / state["n"]
        state["m2"] += d * (v - state["mean"])
        sd = np.sqrt(state["m2"] / state["n"]) if state["n"] > 1 else 1.0
        sd = sd if sd > 0 else 1.0
        mu = state["mean"]
        pred = step(np.array([(v - mu) / sd]), (np.asarray(y, np.float64) - mu) / sd)
        return np.asarray(pred) * sd + mu
    return fn


def peer_runs(task_name: str, quick: bool, only: set[str] | None):
    """(learner, params, factory(seed) -> step fn) for every peer entry."""
    def want(kind):
        return only is None or kind in only
    runs = []
    real = task_name in REAL
    if want("reservoirpy"):
        for g in esn_grid(task_name, quick):
            def make(seed, g=g):
                mk = lambda: reservoirpy_esn(seed=seed, **g)   # noqa: E731
                return _causal_standardise(mk) if real else mk()
            runs.append((f"reservoirpy ESN-{g['units']} + RLS", g, make))
    if want("river"):
        for kind, g in river_grid(task_name, quick):
            def make(seed, kind=kind, g=g):
                mk = (lambda: river_snarimax(**g)) if kind == "snarimax" else (lambda: river_lagged(**g))
                return mk()        # river_lagged standardises inputs and target itself
            runs.append(("river SNARIMAX" if kind == "snarimax" else f"river lagged {g['kind']}", g, make))
        if task_name == "narma10" and not quick:
            g = dict(lags=10, kind="poly-bayes", past_targets=True)
            runs.append(("river poly+Bayes, inputs + past targets", g, lambda seed, g=g: river_lagged(**g)))
    if want("jax") and task_name not in LONG:
        units = esn_grid(task_name, True)[0]["units"]      # the size reservoirpy gets
        g = dict(units=units, lr=1.0, sr=0.9, input_scaling=1.0, delta=1e-4)   # 1e-6 diverges in float32

        def make(seed, g=g):
            mk = lambda: jax_esn_rls(seed=seed, **g)   # noqa: E731
            return _causal_standardise(mk) if real else mk()
        runs.append((f"jax ESN-{units} + RLS (plain jit, floor)", g, make))
    return runs


# ---- the run ----------------------------------------------------------------------------------
def _median_row(task, learner, params, results):
    nr = [r.nrmse for r in results]
    return {"task": task, "learner": learner, "params": params,
            "nrmse": float(np.median(nr)), "nrmse_seeds": nr,
            "mae": float(np.median([r.mae for r in results])),
            "us_per_step": float(np.median([r.us_per_step for r in results])),
            "us_median_step": float(np.median([r.us_median_step for r in results])),
            "persistence_nrmse": float(np.median([r.persistence_nrmse for r in results])),
            "steps": results[0].steps, "window": results[0].window,
            "spans": {k: float(np.median([r.spans[k] for r in results])) for k in (results[0].spans or {})}}


def run(tasks, seeds, steps, window, quick, only, log):
    rows = []
    for name in tasks:
        try:
            streams = {s: get_task(name, steps, s) for s in seeds}
        except TaskError as e:
            log(f"{name}: skipped ({e})")
            continue
        t0 = streams[seeds[0]]
        log(f"{name}: {t0.steps} steps, {t0.mode}, {t0.n_in} channel(s)")
        per = [prequential(_persistence_fn(t), t.inputs, t.targets, window=window, name=name, mode=t.mode,
                           score=t.score, spans=t.spans)
               for t in streams.values()]
        rows.append(_median_row(name, "persistence", {}, per))
        if only is None or "streamtrace" in only:
            for label, cfg in CONFIGS.items():
                if name not in ONLY_ON.get(label, {name}) or label in SKIP_ON.get(name, ()) or \
                        (name in LONG and label not in LONG_CONFIGS | ASKED):
                    continue
                res = []
                for s, t in streams.items():
                    res.append(evaluate(t, cfg(t) if callable(cfg) else cfg, window=window, seed=s, label=label))
                shown = cfg(t0) if callable(cfg) else cfg if cfg is not None else default_config(t0)
                rows.append(_median_row(name, f"streamtrace {label}", shown, res))
                log(f"  streamtrace {label}: nrmse {rows[-1]['nrmse']:.5g} ({rows[-1]['us_per_step']:.0f} us/step)")
        best = {}
        for learner, params, make in peer_runs(name, quick, only):
            try:
                res = [prequential(make(s), t.inputs, t.targets, window=window, name=name, mode=t.mode,
                                   score=t.score, spans=t.spans)
                       for s, t in streams.items()]
            except ImportError as e:
                log(f"  {learner}: not installed ({e.name}); pip install 'streamtrace[quality]'")
                break
            row = _median_row(name, learner, params, res)
            log(f"  {learner} {params}: nrmse {row['nrmse']:.5g} ({row['us_per_step']:.0f} us/step)")
            family = learner               # the best of each kind of learner is shown
            row["tried"] = best.get(family, {}).get("tried", 0) + 1
            if family not in best or row["nrmse"] < best[family]["nrmse"]:
                best[family] = row
            else:
                best[family]["tried"] = row["tried"]
        rows += list(best.values())
    return rows


def _persistence_fn(task: Task):
    last = {"y": task.inputs[0] if task.mode == "forecast" else np.zeros(task.n_out)}

    def fn(x, y):
        pred = np.asarray(x) if task.mode == "forecast" else last["y"]
        last["y"] = np.asarray(y)
        return pred
    return fn


def machine() -> str:
    from timing import machine_line
    return machine_line()


def markdown(rows, header: str) -> str:
    out = [header, "", "| task | learner | NRMSE (median) | NRMSE per seed | MAE | us/step (mean) | us/step (median) | settings |",
           "|---|---|---|---|---|---|---|---|"]
    for task in dict.fromkeys(r["task"] for r in rows):
        for r in sorted((r for r in rows if r["task"] == task), key=lambda r: r["nrmse"]):
            seeds = ", ".join(f"{v:.4g}" for v in r["nrmse_seeds"])
            tried = f" (best of {r['tried']})" if r.get("tried", 1) > 1 else ""
            settings = ", ".join(f"{k}={v}" for k, v in _flat(r["params"]).items()) + tried
            out.append(f"| {task} ({r['steps']} steps, last {r['window']}) | {r['learner']} | {r['nrmse']:.4g} | "
                       f"{seeds} | {r['mae']:.4g} | {r['us_per_step']:.0f} | {r['us_median_step']:.0f} | {settings} |")
    return "\n".join(out) + "\n"


def targets(rows) -> str:
    """Issue 22's targets, each as the ratio it sets, from the rows of this run."""
    def get(task, learner):
        return next((r for r in rows if r["task"] == task and r["learner"] == f"streamtrace {learner}"), None)
    out = ["", "Targets (median of the seeds; a ratio below 1 is better than what it is compared with):", ""]
    for task in ("mackey-glass", "narma10", "co2", "sunspots"):
        h, f = get(task, "default"), get(task, "reservoir alone")
        alone = [r for r in (get(task, k) for k in ("reservoir-240 alone", "reservoir-300 alone")) if r]
        if h and f:
            worst = max(a / b for a, b in zip(h["nrmse_seeds"], f["nrmse_seeds"]))
            e = min(alone, key=lambda r: abs(r["us_median_step"] - h["us_median_step"])) if alone else None
            same = (f"; {e['learner'].split(' ', 1)[1]} (closest step time, {e['us_median_step']:.0f} us) "
                    f"{h['nrmse'] / e['nrmse']:.3f}x") if e else ""
            out.append(f"- {task}: hybrid (default) / reservoir alone {h['nrmse'] / f['nrmse']:.3f}x (target <= "
                       f"1.00x; worst seed {worst:.3f}x; {h['us_median_step']:.0f} vs {f['us_median_step']:.0f} "
                       f"us/step){same}")
    h = get("multichannel", "default")
    fixed = [r for r in (get("multichannel", k) for k in ("reservoir alone", "reservoir-240 alone",
                                                           "reservoir-300 alone")) if r]
    fixed += [r for r in [get("multichannel", "reservoir-800 alone")] if r]
    best = min(fixed, key=lambda r: r["nrmse"]) if fixed else None
    for label in ("default", "gru-32 rtrl alone"):
        h = get("multichannel", label)
        if h and best:
            slower = [r for r in fixed if r["us_median_step"] >= 0.9 * h["us_median_step"]]
            ref = min(slower, key=lambda r: r["nrmse"]) if slower else best
            seeds = ", ".join(f"{a / b:.2f}" for a, b in zip(h["nrmse_seeds"], ref["nrmse_seeds"]))
            out.append(f"- multichannel, {h['steps']} steps: {label} {h['nrmse']:.4g} ({h['us_median_step']:.0f} "
                       f"us/step) / best fixed reservoir of at least its step time {ref['nrmse']:.4g} "
                       f"({ref['learner']}, {ref['us_median_step']:.0f} us/step) = {h['nrmse'] / ref['nrmse']:.2f}x "
                       f"(per seed {seeds}; target <= 0.5x)")
    for label in ("default", "reservoir alone"):
        r = get("regime-switch", label)
        if r and r["spans"]:
            pre, post = r["spans"].get("pre-switch"), r["spans"].get("post-switch")
            out.append(f"- regime-switch, {label}: pre-switch {pre:.3g}, steps 3,500..4,499 {post:.3g} "
                       f"({post / pre:.1f}x its pre-switch error; target: back to it within 1,000 steps)")
    h, f = get("regime-switch", "default"), get("regime-switch", "reservoir alone")
    if h and f:
        out.append(f"- regime-switch after the switch: hybrid / fixed, the same readout {h['nrmse'] / f['nrmse']:.2f}x "
                   f"(target <= 0.8x)")
    f = get("regime-switch", "reservoir alone, no change forgetting")
    if h and f:
        out.append(f"- regime-switch after the switch: hybrid / fixed with the readout before change forgetting "
                   f"{h['nrmse'] / f['nrmse']:.2f}x")
    h, f = get("delay-recall", "default"), get("delay-recall", "reservoir alone")
    if h and f:
        out.append(f"- delay-recall (D = 15): hybrid {h['nrmse']:.3g}, fixed reservoir {f['nrmse']:.3g} "
                   f"(stretch: a trace-learned model below the fixed reservoir)")
    return "\n".join(out) + "\n"


def _flat(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{k}."))
        elif k not in ("n_in", "n_out", "mode"):
            out[prefix + k] = v
    return out


def main(argv=None):
    from streamtrace.learner.dispatch import inline_dispatch
    inline_dispatch()       # as `streamtrace evaluate` runs: every jax step on the calling thread
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1,500 steps, one seed, the first entry of each grid")
    ap.add_argument("--tasks", nargs="+", default=TASKS)
    ap.add_argument("--only", nargs="+", default=None, choices=["streamtrace", "reservoirpy", "river", "jax"])
    ap.add_argument("--configs", nargs="+", default=None, choices=list(CONFIGS), metavar="NAME",
                    help="only these streamtrace configs (default: all of CONFIGS)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = ap.parse_args(argv)
    steps = a.steps or (1500 if a.quick else None)      # None: each task's own length
    window = a.window or (500 if a.quick else 1000)
    seeds = SEEDS[:1] if a.quick else SEEDS
    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    t0 = time.time()
    if a.configs:
        ASKED.update(a.configs)
        for name in list(CONFIGS):
            if name not in a.configs:
                del CONFIGS[name]
    rows = run(a.tasks, seeds, steps, window, a.quick, set(a.only) if a.only else None, log)
    floor = ""
    if a.only is None or "jax" in a.only:
        calls = 500 if a.quick else 3000
        med, p10 = jax_esn_rls_step_us(500, calls=calls)
        floor = (f" A jitted ESN-500 + RLS step alone, tight loop: median {med:.0f} us, "
                 f"10th percentile {p10:.0f} us per step (float32).")
        for units in (200, 500):       # the same math in float64, at the default's and the 500 size
            med, p10 = jax_esn_rls_step_us(units, calls=calls, dtype="float64", delta=1e-8)
            floor += f" Float64 ESN-{units} + RLS: median {med:.0f} us, 10th percentile {p10:.0f} us."
        log(floor.strip())
    header = (f"Prequential one-step-ahead quality: NRMSE = RMSE / std(target) over the last {window} of "
              f"{steps or 'each task its own number of'} steps (a shorter series: its second half; regime-switch: "
              f"steps 3,500..4,499, after its switch), median of {len(seeds)} seed(s); us/step is "
              f"the wall time of the predict+learn calls. Machine: {machine()}; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; run took {time.time() - t0:.0f} s; "
              f"load average at the end {os.getloadavg()[0]:.1f}.{floor}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "quality" + ("-quick" if a.quick else "") + ("-" + "-".join(a.only) if a.only else "") + \
        ("-selected" if a.configs else "") + \
        ("" if a.tasks == TASKS else "-" + "-".join(Path(t).stem for t in a.tasks))   # a partial run: its own file
    (out / f"{stem}.md").write_text(markdown(rows, header) + targets(rows))
    if stem == "quality":       # a full run: the committed copy too
        from results_file import write_section
        write_section("quality", "Learning quality (`make quality`)", markdown(rows, header) + targets(rows))
    (out / f"{stem}.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1, default=str))
    print(markdown(rows, header) + targets(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
