"""Busy polling against the sensor's rate: one sensor's round trips through real ``streamtrace
serve`` engines (GRU-D-RTRL supervised, the default 16 slots and reply first, ipc, unpinned)
that differ only in ``engine.busy_poll_us``, beside the bare ZeroMQ + msgpack echo timed the
same way, at several sensor periods, with the engine's CPU use while the sensor sends.

A window of 1,000 us is the loop's old behaviour (1 ms of polling after any message: a window
no longer than engine/spin.py's SHORT_US), 5,000 us the default (the whole window after a
message that came within it of the last). Each round runs every period: the echo, then each
window's engine in turn; a row's ratio is its p50 / the echo p50 of the same round and
period, and the table gives the median over the rounds with their range.

    nice -n 10 .venv/bin/python bench/poll_window.py [--periods-us 0 1000 2000 4000 10000]
        [--windows-us 1000 5000] [--rounds 3] [--steps 1500] [--write]

Period 0: back to back. ``--write``: the table into bench/RESULTS.md (section ``poll-window``).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from results_file import write_section
from streamtrace.engine.launch import start_engine, stop, write_config
from streamtrace.transport.echo import start_echo
from timing import machine_line, paced, percentiles

WARM_S = 7.0     # back-to-back steps first: the engine compiles its other programs meanwhile


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sensor(endpoint, n, period_us, supervised, warm_s, pid=None):
    """n round trips (us), a request every ``period_us`` (0: right after the last reply),
    after ``warm_s`` of back-to-back ones; and the CPUs ``pid`` used while they ran."""
    from streamtrace.transport import SensorClient
    x = np.zeros(1, np.float32)
    y = x if supervised else None
    with SensorClient(endpoint, stream="bench", timeout_s=30) as c:
        until = time.monotonic() + warm_s
        while time.monotonic() < until:
            c.step(x, y)
        c0, t0 = (cpu_seconds(pid) if pid else 0.0), time.monotonic()
        out = paced(lambda: c.step(x, y), n, period_us)
        used = (cpu_seconds(pid) - c0) / (time.monotonic() - t0) if pid else 0.0
    return out, used


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--periods-us", type=int, nargs="+", default=[0, 1000, 2000, 4000, 10000])
    ap.add_argument("--windows-us", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--write", action="store_true", help="the table into bench/RESULTS.md")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="st-poll-", dir="/tmp"))
    got = {}        # (period, window or "echo") -> [(p50, p99, cpu, echo p50 of the round)]
    for r in range(args.rounds):
        for period in args.periods_us:
            ep = f"ipc://{work}/echo"
            proc = start_echo(ep)
            try:
                lat, _ = sensor(ep, args.steps, period, False, 1.0)
            finally:
                stop(proc)
            echo = percentiles(lat, 1.0)
            got.setdefault((period, "echo"), []).append((echo["p50"], echo["p99"], 0.0, echo["p50"]))
            for i, window in enumerate(args.windows_us):
                ep = f"ipc://{work}/e{i}"
                cfg = write_config(work / f"e{i}.toml", {
                    "model": {"stack": "gru", "n_in": 1, "n_hidden": args.hidden, "n_out": 1},
                    "learning": {"algorithm": "d-rtrl", "mode": "supervised"},
                    "engine": {"busy_poll_us": window},
                    "sockets": {"router": ep, "pull": "", "pub": ""},
                    "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False}})
                proc = start_engine(cfg)
                try:
                    lat, used = sensor(ep, args.steps, period, True, WARM_S, proc.pid)
                finally:
                    stop(proc)
                p = percentiles(lat, 1.0)
                got.setdefault((period, window), []).append((p["p50"], p["p99"], used, echo["p50"]))
                print(f"round {r}, period {period} us, window {window} us: p50 {p['p50']:.0f} us "
                      f"({p['p50'] / echo['p50']:.2f}x echo {echo['p50']:.0f}), p99 {p['p99']:.0f} us, "
                      f"CPU {used:.2f}", flush=True)
    lines = [machine_line("unpinned"), "",
             f"GRU-{args.hidden} D-RTRL supervised, 16 slots, reply first, one sensor over ipc; {args.steps} round "
             f"trips a row after {WARM_S:.0f} s back to back; {args.rounds} rounds; ratios per round to that "
             "round's echo p50, medians over the rounds [range]; CPU: the engine's while the sensor sent", "",
             "| sensor period | echo p50 µs | " + " | ".join(
                 f"window {w} µs: p50 / echo | p99 / echo | CPU" for w in args.windows_us) + " |",
             "|---|---:|" + "---:|---:|---:|" * len(args.windows_us)]
    for period in args.periods_us:
        echo = [e[0] for e in got[(period, "echo")]]
        row = [f"{period} µs" if period else "back to back", f"{np.median(echo):.0f} [{min(echo):.0f}–{max(echo):.0f}]"]
        for w in args.windows_us:
            runs = got[(period, w)]
            r50 = [p50 / e for p50, _, _, e in runs]
            r99 = [p99 / e for _, p99, _, e in runs]
            row += [f"{np.median(r50):.2f}× [{min(r50):.2f}–{max(r50):.2f}]", f"{np.median(r99):.2f}×",
                    f"{np.median([c for _, _, c, _ in runs]):.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    table = "\n".join(lines)
    print("\n" + table)
    if args.write:
        write_section("poll-window", "Busy polling against the sensor's rate (`bench/poll_window.py`)",
                      f"From `nice -n 10 .venv/bin/python bench/poll_window.py --rounds {args.rounds}` "
                      "(the next run with --write replaces this section).\n\n" + table)


if __name__ == "__main__":
    main()
