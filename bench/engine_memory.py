"""Resident memory (RSS) of a real `streamtrace serve` process, GRU-64 and GRU-256 D-RTRL.

    python bench/engine_memory.py [--messages 10000]

Each engine serves one sensor over ipc; RSS is read from /proc after the warm-up (the first
answers, then a pause so the engine loop compiles its micro-batch sizes and gives back what
compiling kept) and again after --messages round trips. The baseline: a bare Python process
that imports jax and the engine's modules, measured the same way.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from streamtrace.transport import SensorClient
from streamtrace.engine.launch import start_engine, stop, write_config
from streamtrace.engine.memory import rss_mb

IMPORTS = "import jax, streamtrace.engine.server, streamtrace.recipe.build, streamtrace.learner, sys; " \
          "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"


def imports_rss() -> float:
    proc = subprocess.Popen([sys.executable, "-c", IMPORTS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    rss = rss_mb(proc.pid)
    proc.communicate("")
    return rss


def engine_rss(hidden: int, messages: int, settle_s: float) -> tuple[float, float]:
    sock = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = write_config(Path(tmp) / "mem.toml", {
            "model": {"stack": "gru", "n_in": 4, "n_hidden": hidden, "n_out": 4},
            "learning": {"algorithm": "d-rtrl", "mode": "forecast"},
            "sockets": {"router": f"ipc://{sock}/router", "pull": "", "pub": ""},
            "checkpoint": {"dir": ""},
        })
        proc = start_engine(cfg)
        try:
            rng = np.random.default_rng(0)
            with SensorClient(f"ipc://{sock}/router", stream="s", timeout_s=120) as c:
                for _ in range(20):
                    c.step(rng.normal(size=4).astype(np.float32))
                time.sleep(settle_s)              # the loop compiles its sizes when idle
                c.step(rng.normal(size=4).astype(np.float32))
                warm = rss_mb(proc.pid)
                for _ in range(messages):
                    c.step(rng.normal(size=4).astype(np.float32))
                return warm, rss_mb(proc.pid)
        finally:
            stop(proc)
            shutil.rmtree(sock, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10000)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds idle after the first answers")
    args = ap.parse_args(argv)
    print(f"imports alone (jax + the engine's modules): {imports_rss():.0f} MB")
    print("| model | RSS after warm-up MB | RSS after %d messages MB |" % args.messages)
    print("|---|---:|---:|")
    for hidden in (64, 256):
        warm, after = engine_rss(hidden, args.messages, args.settle)
        print(f"| GRU-{hidden} D-RTRL | {warm:.0f} | {after:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
