"""The speed targets' ratios from paired rounds: each side of a comparison timed in turn, round
after round, in one process, so a ratio never spans the minutes (and the machine's drift)
between two rows of `make bench`.

Per GRU model of the speed targets (GRU-64 and GRU-256, 1 and 64 slots, both algorithms): our
compiled step (bench/test_step_latency.py's), the limit program with optax's and with a
hand-fused Adam (bench/limits.py) and, when installed, braintrace's step
(bench/reference_braintrace.py). Each round times every side for ~``--round-s`` seconds; the
table gives each side's median over rounds and each ratio as the median of its per-round
ratios. ``--pin-cpu N`` pins the process (as ``make bench`` does with CPU 0).

    .venv/bin/python bench/paired.py --pin-cpu 0 [--rounds 9] [--only gru64-es-64] [--json F] [--md F]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

# (name, hidden, algorithm, slots, what the targets ask of "ours / braintrace"); every row
# asks <= 1.3x its limit
TARGETS = [
    ("gru64-d-1", 64, "d-rtrl", None, "<= 0.2"),
    ("gru64-es-1", 64, "es-d-rtrl", None, "-"),
    ("gru64-d-64", 64, "d-rtrl", 64, "-"),
    ("gru64-es-64", 64, "es-d-rtrl", 64, "<= 1/3 (3x the rate)"),
    ("gru256-d-1", 256, "d-rtrl", None, "-"),
    ("gru256-es-1", 256, "es-d-rtrl", None, "<= 0.5"),
    ("gru256-d-64", 256, "d-rtrl", 64, "<= 1"),
    ("gru256-es-64", 256, "es-d-rtrl", 64, "-"),
]


def sides(hidden, algo, slots, reference: bool) -> dict:
    from limits import make_limit_step
    from timing import N_IN, N_OUT, stack_step
    out = {"streamtrace": stack_step("gru", hidden, algo, slots),
           "limit": make_limit_step(N_IN, hidden, N_OUT, algo, slots, adam="optax"),
           "limit, fused Adam": make_limit_step(N_IN, hidden, N_OUT, algo, slots, adam="fused")}
    if reference:
        from reference_braintrace import make_step
        out["braintrace"] = make_step("gru", N_IN, hidden, N_OUT, algo, batch=slots)[0]
    return out


def paired(fns: dict, rounds: int, round_s: float) -> dict:
    """{side: [median us per round]}: every side timed once per round, in turn."""
    from timing import percentiles, timed
    for f in fns.values():          # compile caches, first-call allocations
        for _ in range(20):
            f()
    per_call = {name: float(np.mean(timed(f, 5))) for name, f in fns.items()}
    calls = {name: max(5, min(2000, int(round_s / max(t, 1e-7)))) for name, t in per_call.items()}
    med = {name: [] for name in fns}
    for r in range(rounds):
        for name, f in fns.items():
            med[name].append(percentiles(timed(f, calls[name]))["p50"])
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in med.items()),
              file=sys.stderr, flush=True)
    return med


def ratio(med: dict, a: str, b: str) -> float | None:
    if a not in med or b not in med:
        return None
    return float(np.median(np.array(med[a]) / np.array(med[b])))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pin-cpu", type=int, default=None)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--round-s", type=float, default=0.3, help="seconds per side per round")
    p.add_argument("--only", nargs="*", default=None, help=f"targets to run: {[t[0] for t in TARGETS]}")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--md", default=None, help="write the table here (markdown)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.round_s <= 0:
        p.error("--rounds must be >= 1 and --round-s > 0")
    unknown = set(args.only or []) - {t[0] for t in TARGETS}
    if unknown:
        p.error(f"unknown target(s) {sorted(unknown)}; choose from {[t[0] for t in TARGETS]}")
    sys.path.insert(0, str(Path(__file__).parent))
    from timing import pin
    pin(args.pin_cpu)
    import jax
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    from reference_braintrace import AVAILABLE
    rows = []
    for name, hidden, algo, slots, wanted in TARGETS:
        if args.only and name not in args.only:
            continue
        print(f"{name}: GRU-{hidden} {algo}, {slots or 1} slot(s)", file=sys.stderr, flush=True)
        med = paired(sides(hidden, algo, slots, AVAILABLE), args.rounds, args.round_s)
        rows.append({"target": name, "hidden": hidden, "algorithm": algo, "slots": slots or 1,
                     "median_us": {n: float(np.median(v)) for n, v in med.items()}, "rounds_us": med,
                     "x_limit": ratio(med, "streamtrace", "limit"),
                     "x_fused_limit": ratio(med, "streamtrace", "limit, fused Adam"),
                     "x_braintrace": ratio(med, "streamtrace", "braintrace"),
                     "limit_x_braintrace": ratio(med, "limit", "braintrace"), "wanted_x_braintrace": wanted})
    cpu = f"pinned to CPU {args.pin_cpu}" if args.pin_cpu is not None else "unpinned"
    lines = [f"paired rounds ({args.rounds} x {args.round_s} s per side), {os.cpu_count()} vCPU, "
             f"jax {jax.__version__}, {cpu}; ratios are medians of per-round ratios", "",
             "| model | streamtrace µs | limit µs | fused-Adam limit µs | braintrace µs | × limit | "
             "× fused-Adam limit | × braintrace | limit × braintrace | target × braintrace |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    fmt = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    for r in rows:
        m = r["median_us"]
        lines.append(f"| GRU-{r['hidden']} {r['algorithm']} {r['slots']} slot(s) | {m['streamtrace']:.1f} | "
                     f"{m['limit']:.1f} | {m['limit, fused Adam']:.1f} | {fmt(m.get('braintrace'), 1)} | "
                     f"{fmt(r['x_limit'])} | {fmt(r['x_fused_limit'])} | {fmt(r['x_braintrace'])} | "
                     f"{fmt(r['limit_x_braintrace'])} | {r['wanted_x_braintrace']} |")
    print("\n" + "\n".join(lines))
    if args.md:
        Path(args.md).write_text("\n".join(lines) + "\n")
        if not args.only:      # a full run: the committed copy too
            from results_file import write_section
            write_section("paired", "Paired step timings (`make bench`)", "\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu, "jax": jax.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
