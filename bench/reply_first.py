"""Reply before learning, end to end: one sensor's request/reply round trips (GRU-D-RTRL, ipc,
unpinned) through real ``streamtrace serve`` engines with ``engine.reply_first`` on and off,
beside the bare ZeroMQ + msgpack echo, all in one run. The rows run in turn, ``--rounds`` times
(the machine is shared and noisy); a row's p50 / p99 is the median over the rounds, each ratio
is taken within a round (against that round's echo or base row) and its median quoted.

Two sensors: back to back (each request as soon as the last reply came, as ``streamtrace bench``
times it) and paced (a request every ``--period-us``, as a sampling sensor sends; the echo is
timed the same way). Rows: supervised and forecast, 1 slot and 16 (the default: a model per
stream, each stepped alone by the one-slot program, learner/bank.py), and forecast with
``learning.forecast_before_update``. Then the step back to back in this process (no sockets):
the update program alone, and the prediction program followed by it (what a step costs when
its reply goes first; one program for any slot count).

    nice -n 10 .venv/bin/python bench/reply_first.py [--hidden 64] [--steps 2000] [--rounds 3]
        [--period-us 2000] [--write]

``--write``: the tables into bench/RESULTS.md (section ``reply-first``).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from results_file import write_section
from streamtrace.engine.launch import start_engine, stop, write_config
from streamtrace.transport.echo import start_echo
from streamtrace.transport.timing import roundtrips
from timing import machine_line, percentiles

WARM_S = 8.0     # the engine compiles its other programs on a thread once traffic starts

ROWS = [   # (name, mode, slots, reply_first, forecast_before_update)
    ("supervised", "supervised", 1, False, False),
    ("supervised", "supervised", 1, True, False),
    ("supervised", "supervised", 16, False, False),
    ("supervised", "supervised", 16, True, False),
    ("forecast", "forecast", 1, True, False),       # reply_first does not apply: the update comes first
    ("forecast", "forecast", 16, True, False),
    ("forecast, before update", "forecast", 1, True, True),
]


def measure(ep, steps, period_us, x, y, warm_s):
    # paced: each request at its tick, so the engine has that long between messages
    lat = roundtrips(ep, steps, None, warmup=1, x=x, y=y, warm_s=warm_s, period_us=period_us)
    p = percentiles(lat, 1.0)
    return p["p50"], p["p99"]


def engine_p50(work, ep, hidden, algorithm, mode, slots, reply_first, before, steps, period_us):
    cfg = write_config(work / "engine.toml", {
        "model": {"stack": "gru", "n_in": 1, "n_hidden": hidden, "n_out": 1},
        "learning": {"algorithm": algorithm, "mode": mode, "forecast_before_update": before},
        "engine": {"slots": slots, "reply_first": reply_first},
        "sockets": {"router": ep, "pull": "", "pub": ""},
        "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False}})
    proc = start_engine(cfg)
    x = np.zeros(1, np.float32)
    try:
        return measure(ep, steps, period_us, x, x if mode == "supervised" else None, WARM_S)
    finally:
        stop(proc)


def echo_p50(work, steps, period_us):
    ep = f"ipc://{work}/echo"
    proc = start_echo(ep)
    try:
        return measure(ep, steps, period_us, np.zeros(1, np.float32), None, 1.0)
    finally:
        stop(proc)


def step_back_to_back(hidden, algorithm, mode, slots, n=3000, reps=5):
    """Median us of the update program alone and of prediction + update, one busy slot,
    interleaved ``reps`` times (sync dispatch, as the engine runs)."""
    import jax
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    from streamtrace.engine import load_config
    from streamtrace.recipe.build import build_learner
    cfg = load_config(None, {"model": {"stack": "gru", "n_in": 1, "n_hidden": hidden, "n_out": 1},
                             "learning": {"algorithm": algorithm, "mode": mode,
                                          "forecast_before_update": mode == "forecast"}})
    L = build_learner(cfg, slots=slots, shared_weights=False)
    P, state = L.programs, [L.buffers]
    key, call = None, P.step().inputs.views

    def update():
        state[0], vec = P.run(state[0], *call)
        return vec
    for m in call[2:]:
        m[...] = False
        m.reshape(-1)[0] = True
    predict = lambda: P.run_predict(state[0], key, *call)
    both = lambda: (predict(), update())
    both()
    ns = time.perf_counter_ns
    got = {"update": [], "predict + update": []}
    for _ in range(reps):
        for name, f in (("update", update), ("predict + update", both)):
            ts = np.empty(n)
            for i in range(n):
                t = ns()
                f()
                ts[i] = ns() - t
            got[name].append(np.median(ts) / 1e3)
    return {k: float(np.median(v)) for k, v in got.items()}, got


def in_engine(hidden, algorithm, slots, n=2000, reps=5):
    """The engine without sockets (EngineCore, one stream, one message a tick): us from a
    message's ingest to its reply handed to the sender, and to the end of its tick, with
    reply_first off and on (interleaved blocks, medians)."""
    from streamtrace import wire
    from streamtrace.engine import EngineCore, load_config
    cores = {}
    for first in (False, True):
        cfg = load_config(None, {"model": {"stack": "gru", "n_in": 1, "n_hidden": hidden, "n_out": 1},
                                 "learning": {"algorithm": algorithm, "mode": "supervised"},
                                 "engine": {"slots": slots, "reply_first": first},
                                 "publish": {"weights_every": 0, "predictions": False}})
        cores[first] = EngineCore(cfg)
        cores[first].warmup()
    x = np.zeros(1, np.float32)
    ns = time.perf_counter_ns
    got = {(first, what): [] for first in (False, True) for what in ("reply", "tick")}
    seq = {False: 0, True: 0}
    for _ in range(reps):
        for first, core in cores.items():
            reply, done = np.empty(n), np.empty(n)
            for i in range(n):
                msg = wire.data_message("s", seq[first], x, x)
                seq[first] += 1
                mark = []
                t = ns()
                core.ingest(msg, b"o")
                out = core.tick(lambda outs: mark.append(ns()))
                done[i] = ns() - t
                reply[i] = (mark[0] - t) if mark else done[i]
                assert mark or out
            got[(first, "reply")].append(np.median(reply) / 1e3)
            got[(first, "tick")].append(np.median(done) / 1e3)
    return {k: float(np.median(v)) for k, v in got.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--algorithm", default="d-rtrl")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--period-us", type=int, default=2000, help="the paced sensor's period")
    ap.add_argument("--write", action="store_true", help="the tables into bench/RESULTS.md")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="st-reply-", dir="/tmp"))
    tables = []
    for period in (0, args.period_us) if args.rounds else ():
        runs = []       # per round: {"echo": (p50, p99), row index: (p50, p99)}
        for r in range(args.rounds):
            got = {"echo": echo_p50(work, args.steps, period)}
            for i, (name, mode, slots, first, before) in enumerate(ROWS):
                got[i] = engine_p50(work, f"ipc://{work}/e{i}", args.hidden, args.algorithm, mode, slots, first,
                                    before, args.steps, period)
                print(f"period {period} us, round {r}: {name}, {slots} slots, reply_first {first}: p50 "
                      f"{got[i][0]:.0f} us, p99 {got[i][1]:.0f} us (echo {got['echo'][0]:.0f})", flush=True)
            runs.append(got)
        tables.append((period, runs))
    b2b = {(mode, 1): step_back_to_back(args.hidden, args.algorithm, mode, 1)   # any engine's slot: one program
           for mode in ("supervised", "forecast")}
    one_slot = {(ROWS[i][1], ROWS[i][3], ROWS[i][4]): i for i in range(len(ROWS)) if ROWS[i][2] == 1}
    lines = [machine_line("unpinned"), "",
             f"GRU-{args.hidden} {args.algorithm}, one sensor, ipc, unpinned, {args.steps} round trips a row, "
             f"{args.rounds} rounds, medians over the rounds (ratios taken within a round)"]
    for period, runs in tables:
        med = lambda f: float(np.median([f(g) for g in runs]))
        how = "back to back (each request right after the last reply)" if not period else \
            f"paced: a request every {period} us (a {1e6 / period:.0f} Hz sensor)"
        lines += ["", f"Sensor {how}; the bare echo p50 {med(lambda g: g['echo'][0]):.0f} us, p99 "
                  f"{med(lambda g: g['echo'][1]):.0f} us:", "",
                  "| mode | slots | reply_first | p50 µs | p99 µs | p50 / echo | p99 / echo | p50 / 1-slot engine |",
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        for i, (name, mode, slots, first, before) in enumerate(ROWS):
            base = one_slot[(mode, first, before)]
            lines.append(f"| {name} | {slots} | {'on' if first and (mode == 'supervised' or before) else 'off'} | "
                         f"{med(lambda g: g[i][0]):.0f} | {med(lambda g: g[i][1]):.0f} | "
                         f"{med(lambda g: g[i][0] / g['echo'][0]):.2f} | {med(lambda g: g[i][1] / g['echo'][1]):.2f} | "
                         f"{med(lambda g: g[i][0] / g[base][0]):.2f} |")
    lines += ["", "The step back to back (this process, no sockets, one busy slot; median of 5 interleaved "
              "blocks of 3,000 calls):", "",
              "| mode | slots | update alone µs | prediction + update µs | ratio |", "|---|---:|---:|---:|---:|"]
    for (mode, slots), (m, _) in b2b.items():
        label = "supervised" if mode == "supervised" else "forecast, before update"
        lines.append(f"| {label} | {slots} | {m['update']:.1f} | {m['predict + update']:.1f} | "
                     f"{m['predict + update'] / m['update']:.2f} |")
    lines += ["", "Inside the engine (EngineCore, no sockets, one stream, supervised; median of 5 interleaved "
              "blocks of 2,000 messages): from a message's ingest to its reply handed over, and to the "
              "end of its tick:", "",
              "| slots | reply_first off: reply (= tick) µs | on: reply µs | on: tick µs |", "|---:|---:|---:|---:|"]
    for slots in (1, 16):
        e = in_engine(args.hidden, args.algorithm, slots)
        lines.append(f"| {slots} | {e[(False, 'reply')]:.1f} | {e[(True, 'reply')]:.1f} | {e[(True, 'tick')]:.1f} |")
    for period, runs in tables:
        fc = np.median([g[4][0] / (g["echo"][0] + b2b[("forecast", 1)][0]["update"]) for g in runs])
        lines += ["", f"Forecast, 1 slot, {'back to back' if not period else f'paced {period} us'}: p50 / (echo "
                  f"p50 + the step back to back) = {fc:.2f}"]
    table = "\n".join(lines)
    print("\n" + table)
    if args.write:
        write_section("reply-first", "Reply before learning (`bench/reply_first.py`)", table)


if __name__ == "__main__":
    main()
