"""Fleet learning (issue 22, part 3): 64 related streams (Mackey-Glass, per-stream delay in
[15, 25] and random phase: ``tasks.mackey_glass_fleet``) learned by one trace-learned model with
SHARED weights (per-stream hidden state and traces) against one model per stream.

Prequential, one step ahead (predict, score, then learn), every stream's squared error kept per
step. The same model for both: a GRU stack (``nn.Stack("gru", 1, H, 1)``, linear readout), D-RTRL,
Adam, float32, ``chain(normalise(100, 0.003), residual())`` (the input transform of the engine's
default learner); each arm with its own best lr from a small grid, every grid entry reported.

- per-stream models (``Slots(64, shared=False)``): final error E_ps = NRMSE (RMSE / std(target))
  over the last 1,000 of N steps, median over streams;
- the shared model (``Slots(64, shared=True, reduce="mean")``): running NRMSE over a 500-step
  window, median over streams, as a function of steps; S = the first step count at which it is
  <= 1.2 x E_ps, and S / N (target: <= 1/4); S_stay = from where on it stays there;
- time per step (one ``learner.step`` call steps all 64 slots; p50 of timed calls after the run)
  and memory per slot (the learner's state bytes / 64; the shared model's weights and Adam
  moments counted once for the fleet).

Median over 3 seeds (a seed changes the fleet and the model's init). The lr is chosen per arm
by the median over seeds (per-stream: lowest E_ps, on the scored window itself: generous to the
per-stream models; shared: lowest S). Writes bench/results/fleet.md and fleet.json (and, on a full run, its section of bench/RESULTS.md); progress on
stderr.

    python bench/fleet.py [--quick] [--steps 12000] [--seeds 0 1 2] [--hidden 32]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from timing import machine_line, percentiles, timed  # noqa: E402

import streamtrace as st  # noqa: E402
from streamtrace.learner import chain, normalise, residual  # noqa: E402
from streamtrace.nn import Stack  # noqa: E402
from streamtrace.evaluation.tasks import fleet_params, mackey_glass_fleet  # noqa: E402

STREAMS = 64
SCORE = 1000          # E_ps: the last 1,000 steps
WINDOW = 500          # the shared model's running NRMSE
FACTOR = 1.2          # target: the shared model within 1.2 x E_ps ...
FRACTION = 0.25       # ... in at most 1/4 of the per-stream models' steps
CHUNK = 500           # steps per step_many call (a scan; the same result as one step() a step)
OUT = Path(__file__).parent / "results"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


RATE = 0.003          # normalise(): the engine's default learner's rate


def make_learner(shared: bool, lr: float, hidden: int, seed: int):
    return st.OnlineLearner(
        Stack("gru", 1, hidden, 1, seed=seed), np.zeros(1, np.float32), algorithm=st.d_rtrl(),
        optimizer=st.adam(lr), mode="forecast", slots=st.Slots(STREAMS, shared=shared, reduce="mean"),
        transform=chain(normalise(100, RATE), residual()))


def memory(learner) -> dict:
    """State bytes: per slot (arrays with a leading slot axis) and shared (the rest)."""
    per, shared = 0, 0
    for v in learner.state_dict().values():
        v = np.asarray(v)
        if learner.per_slot or (v.ndim >= 1 and v.shape[0] == STREAMS):
            per += v.nbytes
        else:
            shared += v.nbytes
    return {"per_slot_bytes": per / STREAMS, "shared_bytes": shared,
            "bytes_per_slot": (per + shared) / STREAMS}


def run(series: np.ndarray, shared: bool, lr: float, hidden: int, seed: int, label: str) -> dict:
    """Prequential run over series (STREAMS, N + 1): squared errors (N, STREAMS) of the
    prediction made at step t (from x_0..x_t) against x_{t+1}."""
    n = series.shape[1] - 1
    learner = make_learner(shared, lr, hidden, seed)
    xs = series.T[:, :, None].astype(np.float32)          # (N + 1, STREAMS, 1)
    preds = np.empty((n, STREAMS), np.float64)
    t0 = time.perf_counter()
    for a in range(0, n, CHUNK):
        b = min(a + CHUNK, n)
        rs = learner.step_many(xs[a:b])
        preds[a:b] = np.stack([r.prediction[:, 0] for r in rs])
        if a == 0:
            t1 = time.perf_counter()          # the first call compiles: not a step's cost
        if (b // CHUNK) % 4 == 0 or b == n:
            log(f"  {label}: {b}/{n} steps, {time.perf_counter() - t0:.0f} s")
    scan_us = (time.perf_counter() - t1) / max(n - CHUNK, 1) * 1e6
    se = (preds - series.T[1:]) ** 2
    # the cost of one step() call (all slots), after the run: what the engine pays per message
    step = learner.programs.step()
    ones = np.ones(STREAMS, bool)
    x, y = xs[-1], np.zeros((STREAMS, 1), np.float32)

    def call():
        learner.buffers, vec = step(learner.buffers, x, y, ones, ones)
        np.asarray(vec)
    us = percentiles(timed(call, 300, warmup=20, max_seconds=10.0))["p50"]
    return {"se": se, "finite": bool(np.isfinite(se).all()), "us_per_step": us, "scan_us_per_step": scan_us,
            **memory(learner)}


def nrmse_last(se: np.ndarray, y: np.ndarray, w: int) -> np.ndarray:
    """Per-stream NRMSE over the last w steps: se (N, S), y (N, S) the targets."""
    return np.sqrt(se[-w:].mean(0)) / y[-w:].std(0)


def running_nrmse(se: np.ndarray, y: np.ndarray, w: int) -> np.ndarray:
    """Median over streams of the NRMSE over steps t-w+1..t, for t = w-1..N-1 (index i: after
    i + w steps)."""
    def win(a):
        c = np.concatenate([np.zeros((1, a.shape[1])), np.cumsum(a, 0)])
        return (c[w:] - c[:-w]) / w
    mse, m1, m2 = win(se), win(y), win(y * y)
    sd = np.sqrt(np.maximum(m2 - m1 * m1, 1e-30))
    with np.errstate(invalid="ignore"):
        return np.median(np.sqrt(mse) / sd, axis=1)


def reach(curve: np.ndarray, level: float, w: int) -> tuple[int | None, int | None]:
    """(first step count at which curve <= level, step count from which it stays there)."""
    ok = curve <= level
    if not ok.any():
        return None, None
    first = int(np.argmax(ok)) + w
    bad = np.nonzero(~ok)[0]
    stay = w if bad.size == 0 else (int(bad[-1]) + 1 + w if bad[-1] + 1 < ok.size else None)
    return first, stay


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3,000 steps, one seed, lr 1e-3 (per-stream), 1e-3 and 3e-3 (shared)")
    ap.add_argument("--steps", type=int, default=12000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--lrs-ps", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3])
    ap.add_argument("--lrs-shared", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3, 1e-2])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--normalise-rate", type=float, default=0.003)
    args = ap.parse_args()
    global RATE
    RATE = args.normalise_rate
    if args.quick:
        args.steps, args.seeds = 3000, args.seeds[:1]
        args.lrs_ps, args.lrs_shared = [1e-3], [1e-3, 3e-3]
    n = args.steps
    t_start = time.perf_counter()
    runs = {"per-stream": {}, "shared": {}}          # arm -> lr -> seed -> result
    curves = {}
    for seed in args.seeds:
        series = mackey_glass_fleet(STREAMS, n + 1, seed)
        y = series.T[1:]
        for arm, shared, lrs in (("per-stream", False, args.lrs_ps), ("shared", True, args.lrs_shared)):
            for lr in lrs:
                label = f"seed {seed} {arm} lr {lr:g}"
                r = run(series, shared, lr, args.hidden, seed, label)
                per_stream = nrmse_last(r["se"], y, SCORE)
                curve = running_nrmse(r["se"], y, WINDOW)
                curves[(arm, lr, seed)] = curve
                runs[arm].setdefault(lr, {})[seed] = {
                    "final_nrmse": float(np.median(per_stream)), "finite": r["finite"],
                    "final_nrmse_p90": float(np.percentile(per_stream, 90)),
                    "us_per_step": r["us_per_step"], "scan_us_per_step": r["scan_us_per_step"],
                    "bytes_per_slot": r["bytes_per_slot"],
                    "per_slot_bytes": r["per_slot_bytes"], "shared_bytes": r["shared_bytes"]}
                log(f"{label}: final NRMSE {np.median(per_stream):.4f} (median of {STREAMS}), "
                    f"{r['us_per_step']:.0f} us/step, {time.perf_counter() - t_start:.0f} s so far")

    def med(arm, lr, key):
        vals = [runs[arm][lr][s][key] for s in args.seeds]
        vals = [v for v in vals if v is not None]
        return float(np.median(vals)) if len(vals) == len(args.seeds) else None

    best_ps = min(args.lrs_ps, key=lambda lr: (np.nan_to_num(med("per-stream", lr, "final_nrmse"), nan=np.inf)))
    # each shared lr against the per-stream models' best, seed by seed
    for lr in args.lrs_shared:
        for seed in args.seeds:
            e_ps = runs["per-stream"][best_ps][seed]["final_nrmse"]
            first, stay = reach(curves[("shared", lr, seed)], FACTOR * e_ps, WINDOW)
            runs["shared"][lr][seed].update(E_ps=e_ps, S=first, S_stay=stay,
                                            S_over_N=None if first is None else first / n)

    def s_key(lr):
        s = [runs["shared"][lr][seed]["S"] for seed in args.seeds]
        return (sum(v is None for v in s), float(np.median([v if v is not None else 10 * n for v in s])),
                med("shared", lr, "final_nrmse"))
    best_sh = min(args.lrs_shared, key=s_key)
    # the shared model at the per-stream models' own lr too, where the grid has it (same model and lr)
    summary = {"steps": n, "streams": STREAMS, "hidden": args.hidden, "seeds": args.seeds,
               "lr_per_stream": best_ps, "lr_shared": best_sh, "factor": FACTOR, "fraction": FRACTION,
               "score_window": SCORE, "running_window": WINDOW, "machine": machine_line(),
               "tau": {str(s): fleet_params(STREAMS, s)["tau"].tolist() for s in args.seeds},
               "runs": {arm: {f"{lr:g}": {str(s): v for s, v in d.items()} for lr, d in a.items()}
                        for arm, a in runs.items()},
               "wall_s": time.perf_counter() - t_start}
    sh = runs["shared"][best_sh]
    ps = runs["per-stream"][best_ps]
    s_vals = [sh[s]["S"] for s in args.seeds]
    s_med = None if any(v is None for v in s_vals) else float(np.median(s_vals))
    e_ps_med = float(np.median([ps[s]["final_nrmse"] for s in args.seeds]))
    summary.update(E_ps=e_ps_med, S=s_med, S_over_N=None if s_med is None else s_med / n,
                   met=s_med is not None and s_med / n <= FRACTION)
    if best_ps in runs["shared"]:          # the same model and lr for both
        same = [runs["shared"][best_ps][s]["S"] for s in args.seeds]
        summary["same_lr"] = {"lr": best_ps, "S": None if None in same else float(np.median(same))}
    # curve checkpoints of the chosen shared lr (median over seeds) for the table
    marks = [m for m in (500, 1000, 1500, 2000, 3000, 4000, 6000, 8000, 12000, 16000) if m <= n]
    curve_at = {m: float(np.median([curves[("shared", best_sh, s)][m - WINDOW] for s in args.seeds]))
                for m in marks}
    ps_curve_at = {m: float(np.median([curves[("per-stream", best_ps, s)][m - WINDOW] for s in args.seeds]))
                   for m in marks}
    summary["curve_shared"] = curve_at
    summary["curve_per_stream"] = ps_curve_at
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(json.dumps(summary, indent=1))
    md = report(summary, runs, args, best_ps, best_sh, curve_at, ps_curve_at)
    (out / "fleet.md").write_text(md)
    if not args.quick:      # a full run: the committed copy too
        from results_file import write_section
        write_section("fleet", "Fleet learning (`bench/fleet.py`)", md.split("\n", 1)[1])
    print(md)


def _f(v, fmt="{:.4f}"):
    return "—" if v is None else fmt.format(v)


def report(summary, runs, args, best_ps, best_sh, curve_at, ps_curve_at) -> str:
    n, seeds = summary["steps"], args.seeds
    lines = [f"# Fleet learning: {STREAMS} Mackey-Glass streams (tau in [15, 25], random phase), "
             f"shared weights vs a model per stream", "",
             f"Machine: {summary['machine']}", "",
             f"GRU-{args.hidden} stack + linear readout, D-RTRL, Adam, float32, normalise(100, {RATE:g}) + residual; "
             f"prequential one step ahead, N = {n:,} steps per stream; seeds {seeds} (fleet and init); "
             f"`python bench/fleet.py{' --quick' if args.quick else ''}` ({summary['wall_s']:.0f} s).", ""]
    met = summary["met"]
    lines += [f"**Target** (shared model within {FACTOR} x E_ps in <= 1/4 of the per-stream steps): "
              f"**{'met' if met else 'missed'}**: E_ps = {summary['E_ps']:.4f} (per-stream lr {best_ps:g}), "
              f"the shared model (lr {best_sh:g}) reaches {FACTOR} x E_ps after S = {_f(summary['S'], '{:.0f}')} "
              f"steps per stream, S / N = {_f(summary['S_over_N'], '{:.3f}')} (target <= {FRACTION}); "
              "median of the seeds."]
    if "same_lr" in summary:
        sl = summary["same_lr"]
        lines[-1] += (f" At the same lr as the per-stream models ({sl['lr']:g}) the shared model's S = "
                      f"{_f(sl['S'], '{:.0f}')}, S / N = {_f(None if sl['S'] is None else sl['S'] / n, '{:.3f}')}.")
    lines.append("")
    lines += ["| seed | E_ps (per-stream, last 1,000) | shared final (last 1,000) | S | S / N | S_stay | "
              "µs/step per-stream (scan) | µs/step shared (scan) | bytes/slot per-stream | bytes/slot shared |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ps, sh = runs["per-stream"][best_ps], runs["shared"][best_sh]
    for s in seeds:
        lines.append(f"| {s} | {ps[s]['final_nrmse']:.4f} | {sh[s]['final_nrmse']:.4f} | {_f(sh[s]['S'], '{:.0f}')} | "
                     f"{_f(sh[s]['S_over_N'], '{:.3f}')} | {_f(sh[s]['S_stay'], '{:.0f}')} | "
                     f"{ps[s]['us_per_step']:.0f} ({ps[s]['scan_us_per_step']:.0f}) | "
                     f"{sh[s]['us_per_step']:.0f} ({sh[s]['scan_us_per_step']:.0f}) | "
                     f"{ps[s]['bytes_per_slot']:,.0f} | {sh[s]['bytes_per_slot']:,.0f} |")

    def m(d, k, fmt):
        vals = [d[s][k] for s in seeds]
        return "—" if any(v is None for v in vals) else fmt.format(float(np.median(vals)))
    lines.append(f"| **median** | **{m(ps, 'final_nrmse', '{:.4f}')}** | {m(sh, 'final_nrmse', '{:.4f}')} | "
                 f"**{m(sh, 'S', '{:.0f}')}** | **{m(sh, 'S_over_N', '{:.3f}')}** | {m(sh, 'S_stay', '{:.0f}')} | "
                 f"{m(ps, 'us_per_step', '{:.0f}')} ({m(ps, 'scan_us_per_step', '{:.0f}')}) | "
                 f"{m(sh, 'us_per_step', '{:.0f}')} ({m(sh, 'scan_us_per_step', '{:.0f}')}) | "
                 f"{m(ps, 'bytes_per_slot', '{:,.0f}')} | {m(sh, 'bytes_per_slot', '{:,.0f}')} |")
    s0 = sh[seeds[0]]
    lines += ["", f"µs/step: one `learner.step` call stepping all {STREAMS} slots (p50 of timed calls after the "
              f"run; this machine is shared and loaded, so µs are noisy); in brackets: the run's own µs per step after its first "
              f"call (which compiles), steps taken {CHUNK} at a time by `step_many` (one scan per call, the same result). Bytes/slot: the learner's state / "
              f"{STREAMS}; shared: {s0['per_slot_bytes']:,.0f} B per slot (hidden state, traces, transform, "
              f"metrics) + {s0['shared_bytes']:,.0f} B of weights and Adam moments for the whole fleet. "
              f"S: first step count at which the shared model's running NRMSE ({WINDOW}-step window, median over "
              f"streams) is <= {FACTOR} x E_ps of the same seed; S_stay: from where on it stays there.", "",
              f"Running NRMSE ({WINDOW}-step window, median over streams and seeds) after k steps per stream:", "",
              "| k | " + " | ".join(f"{k:,}" for k in curve_at) + " |",
              "|---|" + "---:|" * len(curve_at),
              f"| shared (lr {best_sh:g}) | " + " | ".join(f"{v:.4f}" for v in curve_at.values()) + " |",
              f"| per-stream (lr {best_ps:g}) | " + " | ".join(f"{v:.4f}" for v in ps_curve_at.values()) + " |",
              "", "Every grid entry (median over seeds; per-stream lr chosen by E_ps, shared lr by S against "
              "the chosen per-stream E_ps):", "",
              "| arm | lr | final NRMSE (last 1,000) | S | S / N | S_stay | finite |", "|---|---:|---:|---:|---:|---:|---|"]
    for arm in ("per-stream", "shared"):
        for lr, d in runs[arm].items():
            fin = all(d[s]["finite"] for s in seeds)
            chosen = " (chosen)" if lr == (best_ps if arm == "per-stream" else best_sh) else ""
            s_txt = m(d, "S", "{:.0f}") if arm == "shared" else ""
            r_txt = m(d, "S_over_N", "{:.3f}") if arm == "shared" else ""
            st_txt = m(d, "S_stay", "{:.0f}") if arm == "shared" else ""
            lines.append(f"| {arm}{chosen} | {lr:g} | {m(d, 'final_nrmse', '{:.4f}')} | {s_txt} | {r_txt} | {st_txt} | "
                         f"{'yes' if fin else 'no'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
