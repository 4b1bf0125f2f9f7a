"""Memory per slot of the engine's slot bank (a model per stream, the default), for the default,
the 200-unit reservoir alone and the small config (bench/quality.py), Mackey-Glass's shapes.

    .venv/bin/python bench/slot_memory.py [--slots 16]

Measured: the bytes of the arrays a 16-slot bank holds, each array counted once (the fixed
weights are one array shared by every slot). The formula: the readout's inverse covariance
P is k ridges x F^2 floats (F = reservoir + learned cell + input + bias features), its weights
k x F; the fixed weights (n_in + 1 + H) x H floats are held once; the rest (traces, the cell's
weights, hidden state, statistics) is listed as measured.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from quality import CONFIGS  # noqa: E402

from streamtrace.recipe.build import build_learner  # noqa: E402
from streamtrace.evaluation.scoring import default_config, task_config  # noqa: E402
from streamtrace.learner.bank import SlotBank  # noqa: E402
from streamtrace.evaluation.tasks import get_task  # noqa: E402


def row(label: str, slots: int) -> str:
    task = get_task("mackey-glass", 1000, 0)
    make = CONFIGS[label]
    cfg = task_config(task, make(task) if callable(make) else make or default_config(task), 0)
    bank = SlotBank(lambda n: build_learner(cfg, slots=n, shared_weights=False), slots)
    held = {id(a): a.nbytes for state in bank.states for a in state}
    own = (sum(held.values()) - bank.shared_bytes()) / slots
    assert own == bank.slot_bytes()            # every slot the same size
    size = 8 if cfg.model.precision == 64 else 4
    h, g, n_in = cfg.model.n_hidden, cfg.learned.n_hidden if cfg.learned.stack else 0, cfg.model.n_in
    k, f = len(cfg.readout.delta), h + g + n_in + 1
    readout = (k * f * f + k * f) * size
    fixed = (n_in + 1 + h) * h * size
    rest = bank.slot_bytes() - readout
    return (f"| {label} | {h} | {g or '-'} | {k} | {f} | {readout:,} | {rest:,} | {bank.slot_bytes():,} "
            f"({bank.slot_bytes() / 1e6:.3f} MB) | {fixed:,} = {bank.shared_bytes():,} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=16)
    a = ap.parse_args(argv)
    print(f"{a.slots} slots, float64, Mackey-Glass (1 input)\n")
    print("| config | reservoir H | learned G | ridges k | features F | readout 8k(F^2+F) B | rest B "
          "| a slot's own B | fixed weights 8(H+2)H B, held once |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label in ("default", "reservoir alone", "small"):
        print(row(label, a.slots), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
