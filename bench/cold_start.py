"""Cold start: `streamtrace serve` started to its first prediction, GRU-256 D-RTRL.

    python bench/cold_start.py [--runs 3] [--hidden 256]

The first run uses an empty compile cache (first-ever start), the others the cache it filled
(a warm start). Each run is a fresh process; the clock starts before the process is spawned
and stops when the first reply to a data message arrives. With --profile, the engine's own
log lines are printed with their times (where the start goes).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from streamtrace.transport import SensorClient
from streamtrace.engine.launch import start_engine, stop, write_config


def one_start(folder: Path, cache: Path, hidden: int) -> float:
    sock = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    cfg = write_config(folder / "cold.toml", {
        "model": {"stack": "gru", "n_in": 4, "n_hidden": hidden, "n_out": 4},
        "learning": {"algorithm": "d-rtrl", "mode": "forecast"},
        "engine": {"compile_cache_dir": str(cache)},
        "sockets": {"router": f"ipc://{sock}/router", "pull": "", "pub": ""},
        "checkpoint": {"dir": ""},
    })
    t0 = time.perf_counter()
    proc = start_engine(cfg)
    try:
        with SensorClient(f"ipc://{sock}/router", stream="s", timeout_s=120) as c:
            c.step(np.zeros(4, np.float32))
            return time.perf_counter() - t0
    finally:
        stop(proc)
        shutil.rmtree(sock, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="warm starts after the first-ever one")
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder, cache = Path(tmp), Path(tmp) / "cache"
        first = one_start(folder, cache, args.hidden)
        warm = [one_start(folder, cache, args.hidden) for _ in range(args.runs)]
    print(f"GRU-{args.hidden} serve to first prediction: first-ever {first:.2f} s, warm cache median "
          f"{statistics.median(warm):.2f} s (runs: {', '.join(f'{w:.2f}' for w in warm)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
