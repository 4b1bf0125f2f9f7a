"""Forecasts H steps ahead, per lead (`make quality`): the default learner with ``[learning]
horizon = H`` on Mackey-Glass (H = 10) and co2 (H = 12), each lead's NRMSE beside persistence
and the seasonal naive forecast at that lead (streamtrace/evaluation/leads.py), median of 3 seeds.

    .venv/bin/python bench/lead_rows.py [--seeds 0 1 2]
"""
from __future__ import annotations

import argparse

import numpy as np

from streamtrace.evaluation.leads import evaluate_leads

# (task, horizon, the seasonal naive forecast's period: the one that scores best in hindsight)
CASES = [("mackey-glass", 10, 101), ("co2", 12, 52)]


def main(argv=None) -> int:
    from streamtrace.learner.dispatch import inline_dispatch
    inline_dispatch()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    a = ap.parse_args(argv)
    print("| task | lead | default (median) | per seed | persistence | seasonal naive | "
          "/ persistence | / seasonal naive |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for task, horizon, period in CASES:
        runs = [evaluate_leads(task, horizon=horizon, period=period, seed=s) for s in a.seeds]
        for h in range(horizon):
            m = [r.nrmse[h] for r in runs]
            p = float(np.median([r.persistence[h] for r in runs]))
            s = float(np.median([r.seasonal[h] for r in runs]))
            print(f"| {task} H={horizon} (p={period}) | {h + 1} | {np.median(m):.4g} | "
                  f"{', '.join(f'{v:.4g}' for v in m)} | {p:.4g} | {s:.4g} | {np.median(m) / p:.3f} | "
                  f"{np.median(m) / s:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
