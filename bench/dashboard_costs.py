"""What watching the engine costs it, in paired rounds (conditions in turn, round after round,
against one engine process):

* throughput (steps/s, pipelined request/reply) with no subscriber and with a stalled one (a
  SUB that never reads: the engine's no-drop XPUB refuses and counts what it cannot take);
* end-to-end round-trip p50 with no dashboard and with a dashboard attached and a page open
  on it (an SSE client reading /events at the dashboard's 10 updates/s).

    python bench/dashboard_costs.py [--rounds 4] [--steps 3000] [--md out.md]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from dashboard_helpers import free_port, start_dashboard  # noqa: E402
from streamtrace.transport import SensorClient  # noqa: E402
from streamtrace.engine.launch import start_engine, stop, write_config  # noqa: E402


NEXT = {}     # stream -> next seq: two streams (two slots) go on across rounds


def client(endpoint, stream, n):
    start = NEXT.get(stream, 0)
    NEXT[stream] = start + n
    return SensorClient(endpoint, stream=stream, start_seq=start, timeout_s=120)


def cpu_s(pid: int) -> float:
    """CPU time of a process, all its threads (the ZeroMQ I/O thread too)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(endpoint: str, n: int, stream: str, window: int = 16, pid: int | None = None):
    """Pipelined: at most ``window`` requests in flight (well under half the engine's reply
    queue, sockets.hwm = 100 here: ZeroMQ updates a queue's fill level in batches of half)."""
    x = np.zeros(1, np.float32)
    with client(endpoint, stream, n + 200) as c:
        for _ in range(200):       # warm
            c.step(x)
        t0, c0, sent, got = time.perf_counter(), cpu_s(pid) if pid else 0.0, 0, 0
        while got < n:
            while sent < n and sent - got < window:
                c.send(x)
                sent += 1
            c.recv()
            got += 1
        wall = time.perf_counter() - t0
        return n / wall, ((cpu_s(pid) - c0) / n * 1e6 if pid else float("nan"))


def roundtrip_p50(endpoint: str, n: int, stream: str) -> float:
    x = np.zeros(1, np.float32)
    from timing import timed
    with client(endpoint, stream, n + 300) as c:
        out = timed(lambda: c.step(x), n, warmup=300)
    return float(np.median(out) * 1e6)


def stalled_sub(endpoint: str):
    s = zmq.Context.instance().socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, 100)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(endpoint)
    time.sleep(0.3)
    return s


class Page:
    """A page open on the dashboard: reads its event stream until closed."""

    def __init__(self, url: str):
        self.events, self._stop = 0, threading.Event()
        self.resp = urllib.request.urlopen(url, timeout=30)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for line in self.resp:
                if self._stop.is_set():
                    break
                self.events += line.startswith(b"data: ")
        except (OSError, ValueError, AttributeError):   # closed under the reader: the round is over
            pass

    def close(self):
        self._stop.set()
        self.resp.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--md", default="")
    ap.add_argument("--only", choices=["stalled", "dashboard"], default=None)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="st-dcost-", dir="/tmp"))
    ep = {k: f"ipc://{work}/{k}" for k in ("router", "pull", "pub")}
    cfg = write_config(work / "engine.toml", {
        "model": {"stack": "gru", "n_in": 1, "n_hidden": 16, "n_out": 1},
        # no busy polling: the engine's CPU time is then the work of its steps alone
        "engine": {"slots": 2, "busy_poll_us": 0}, "sockets": {**ep, "hwm": 100}, "publish": {"weights_every": 0}})
    engine = start_engine(cfg)
    rates = {"none": [], "stalled": []}
    cpu = {"none": [], "stalled": []}
    p50 = {"none": [], "dashboard": []}
    try:
        # the engine compiles its other programs between messages after its first answer:
        # traffic until that is over, so no round waits for the compiler
        for _ in range(3):
            throughput(ep["router"], a.steps, "tp")
        print("warm", flush=True)
        for r in range(a.rounds):
            for cond in (() if a.only == "dashboard" else ("none", "stalled") if r % 2 == 0 else ("stalled", "none")):
                s = stalled_sub(ep["pub"]) if cond == "stalled" else None
                rate, us = throughput(ep["router"], a.steps, "tp", pid=engine.pid)
                rates[cond].append(rate)
                cpu[cond].append(us)
                if s is not None:
                    s.close(0)
            for cond in (() if a.only == "stalled" else ("none", "dashboard") if r % 2 == 0 else ("dashboard", "none")):
                board = page = None
                if cond == "dashboard":
                    board, url = start_dashboard(ep["pub"], free_port())
                    page = Page(url + "events?streams=rt")
                    time.sleep(1.0)
                p50[cond].append(roundtrip_p50(ep["router"], a.steps, "rt"))
                if page is not None:
                    print(f"  page got {page.events} updates", flush=True)
                    page.close()
                    stop(board)
            print(f"round {r}: steps/s {({k: round(v[-1]) for k, v in rates.items() if v})} "
                  f"engine CPU us/step {({k: round(v[-1], 1) for k, v in cpu.items() if v})}; "
                  f"p50 us {({k: round(v[-1]) for k, v in p50.items() if v})}", flush=True)
    finally:
        stop(engine)
        shutil.rmtree(work, ignore_errors=True)
    tp = [s / n for s, n in zip(rates["stalled"], rates["none"])]
    lat = [d / n for d, n in zip(p50["dashboard"], p50["none"])]
    # steps/s the engine's CPU time allows: wall-clock rates swing with other load on the machine
    cap = [n / s for s, n in zip(cpu["stalled"], cpu["none"])]
    lines = ["| measure | without | with | ratio per round (median) |", "|---|---|---|---|"]
    if tp:
        lines.append(f"| steps/s, stalled subscriber | {np.median(rates['none']):.0f} | {np.median(rates['stalled']):.0f} | "
                     f"{', '.join(f'{v:.2f}' for v in tp)} ({np.median(tp):.2f}x) |")
        lines.append(f"| engine CPU us per step, stalled subscriber (as steps/s) | {np.median(cpu['none']):.1f} | "
                     f"{np.median(cpu['stalled']):.1f} | {', '.join(f'{v:.2f}' for v in cap)} ({np.median(cap):.2f}x) |")
    if lat:
        lines.append(f"| round-trip p50 (us), dashboard + page open | {np.median(p50['none']):.0f} | "
                     f"{np.median(p50['dashboard']):.0f} | {', '.join(f'{v:.2f}' for v in lat)} ({np.median(lat):.2f}x) |")
    print("\n".join(lines))
    if a.md:
        Path(a.md).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
