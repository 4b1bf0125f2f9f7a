"""Command line: ``streamtrace serve | demo | bench | learn | evaluate | replay``.

serve   run the streaming engine (TOML config; every key has a default that just works)
demo    start an engine and several synthetic sensor streams on loopback, show live progress,
        end with a summary table and a PNG plot
bench   end-to-end latency: sensor -> engine -> prediction round trips, with a bare ZeroMQ +
        msgpack echo server (the transport floor) measured in the same run; with --config FILE,
        your own model: compile time, step p50/p99, trace memory, against the dispatch floor
learn   the engine-free online learning demo (one process, loss printed as it falls)
evaluate  prequential one-step-ahead quality of a config on a task or a CSV/NPY file
replay  send a recorded CSV/NPY/Parquet file to an engine row by row and score its predictions
worker, cluster up | status   scale out on NATS JetStream (streamtrace[cluster]; docs/cluster.md)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


# ---- helpers ----------------------------------------------------------------------------
def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def write_config(path: Path, sections: dict) -> Path:
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_engine(config: Path, *, cpu: int | None = None, log=None) -> subprocess.Popen:
    """The engine in a child process; returns once it listens."""
    cmd = [sys.executable, "-m", "streamtrace", "serve", "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log or subprocess.STDOUT, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None)
    for line in proc.stdout:
        if line.startswith("streamtrace engine:"):
            return proc
        if log is None:
            sys.stderr.write("  engine: " + line)
    raise RuntimeError(f"the engine exited with code {proc.wait()} before listening")


def start_echo(endpoint: str, cpu: int | None = None) -> subprocess.Popen:
    """The bare ZeroMQ + msgpack echo server (the transport floor) in a child process;
    returns once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "streamtrace.engine.echo", endpoint,
                             str(-1 if cpu is None else cpu)], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc


def stop(proc: subprocess.Popen, timeout: float = 30.0):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---- serve ------------------------------------------------------------------------------
def cmd_serve(args) -> int:
    from .engine import ConfigError, load_config, serve
    try:
        return serve(load_config(args.config), announce=lambda s: print(s, flush=True))
    except ConfigError as e:   # one line, no traceback: every bad value names its key
        print("config error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2


# ---- demo -------------------------------------------------------------------------------
def _signal(kind: int, n: int):
    import numpy as np
    t = np.arange(n)
    rng = np.random.default_rng(kind)
    f1, f2 = 0.05 + 0.02 * kind, 0.013 + 0.004 * kind
    s = np.sin(f1 * t) + 0.5 * np.sin(f2 * t + kind) + 0.03 * rng.normal(size=n)
    return s.astype(np.float32)


def cmd_demo(args) -> int:
    import threading

    import numpy as np

    from .adapters import SensorClient, Subscriber
    work = Path(tempfile.mkdtemp(prefix="streamtrace-demo-"))
    base = f"ipc://{work}/"
    config = write_config(work / "engine.toml", {
        "model": {"stack": args.model, "n_in": 1, "n_hidden": args.hidden, "n_out": 1},
        "learning": {"algorithm": args.algorithm, "mode": "forecast", "lr": args.lr},
        "engine": {"slots": max(args.streams, 1)},
        "sockets": {"router": base + "router", "pull": base + "pull", "pub": base + "pub"},
        "publish": {"weights_every": 500, "stats_every_s": 1.0, "predictions": False},
        "checkpoint": {"dir": str(work / "checkpoints"), "every": 2000},
    })
    print(f"streamtrace demo: engine with {args.model.upper()}-{args.hidden} ({args.algorithm}, forecast), "
          f"{args.streams} synthetic sensor streams x {args.steps} steps over ZeroMQ ipc")
    engine = start_engine(config)
    signals = [_signal(i, args.steps + 1) for i in range(args.streams)]
    losses = [np.full(args.steps, np.nan) for _ in range(args.streams)]
    preds = [np.full(args.steps, np.nan) for _ in range(args.streams)]
    done = [0] * args.streams
    errors = []

    def sensor(i):
        try:
            with SensorClient(base + "router", stream=f"sensor-{i}") as c:
                for t in range(args.steps):
                    r = c.step(signals[i][t:t + 1])
                    preds[i][t] = r.pred[0]
                    losses[i][t] = np.nan if r["loss"] is None else r["loss"]
                    done[i] = t + 1
        except Exception as e:  # shown in the summary, the demo still ends cleanly
            errors.append(f"sensor-{i}: {e}")

    stats = Subscriber(base + "pub", (b"stats",))
    threads = [threading.Thread(target=sensor, args=(i,), daemon=True) for i in range(args.streams)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    try:
        while any(th.is_alive() for th in threads):
            got = stats.recv(timeout_s=1.0)
            if got:
                s = got[1]
                recent = [np.nanmean(l[max(1, d - 200):d]) for l, d in zip(losses, done) if d > 2]
                recent = float(np.mean(recent)) if recent else float("nan")
                print(f"  {time.perf_counter() - t0:5.1f}s  steps {sum(done):7d}  {s['steps_per_s']:7.0f} steps/s  "
                      f"latency p50 {s['latency_us']['p50']:6.0f} us  p99 {s['latency_us']['p99']:6.0f} us  "
                      f"recent MSE {recent:.4f}", flush=True)
    finally:
        for th in threads:
            th.join(timeout=5)
        stats.close()
        stop(engine)
    elapsed = time.perf_counter() - t0
    window = max(1, args.steps // 10)
    print(f"\n{'stream':10s} {'steps':>6s} {'first MSE':>10s} {'last MSE':>10s} {'fell':>6s}")
    ratios = []
    for i in range(args.streams):
        first, last = np.nanmean(losses[i][1:window]), np.nanmean(losses[i][-window:])
        ratios.append(first / last)
        print(f"sensor-{i:<3d} {done[i]:6d} {first:10.4f} {last:10.5f} {first / last:5.1f}x")
    print(f"{sum(done)} steps in {elapsed:.1f}s ({sum(done) / elapsed:.0f} steps/s over {args.streams} streams)")
    for e in errors:
        print("error:", e)
    if args.plot:
        _plot(args.plot, signals[0], preds[0], losses, window)
        print(f"plot: {args.plot}")
    return 0 if not errors and all(r > 1 for r in ratios) else 1


def _plot(path, signal, pred, losses, window):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 6))
    n = len(pred)
    show = slice(max(0, n - 300), n)
    t = np.arange(n)
    a.plot(t[show], signal[1:n + 1][show], label="signal (next sample)")
    a.plot(t[show], pred[show], "--", label="prediction")
    a.set_title("sensor-0: one-step-ahead prediction, last 300 steps")
    a.legend(loc="upper right")
    for i, l in enumerate(losses):
        k = np.ones(window) / window
        b.plot(np.convolve(np.nan_to_num(l, nan=l[1]), k, mode="valid"), label=f"sensor-{i}")
    b.set_yscale("log")
    b.set_title("online loss (moving average)")
    b.set_xlabel("step")
    b.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


# ---- bench ------------------------------------------------------------------------------
def _roundtrips(endpoint: str, n: int, cpu: int | None, warmup: int = 500, x=None, y=None, warm_s: float = 0.0):
    import numpy as np

    from .adapters import SensorClient
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    x = np.zeros(1, np.float32) if x is None else x
    out = np.empty(n)
    with SensorClient(endpoint, stream="bench", timeout_s=30) as c:
        warm_until = time.monotonic() + warm_s
        while warmup and time.monotonic() < warm_until:
            c.step(x, y)
        for i in range(warmup + n):
            t0 = time.perf_counter()
            c.step(x, y)
            if i >= warmup:
                out[i - warmup] = time.perf_counter() - t0
    if cpu is not None:
        os.sched_setaffinity(0, set(range(os.cpu_count())))
    return out * 1e6


def cmd_bench_config(args) -> int:
    import json

    from .benchmark import bench_config, format_table
    from .engine import ConfigError, load_config
    if args.iters < 1 or args.steps < 1:
        print(f"bench: --iters and --steps must be >= 1; got {args.iters}, {args.steps}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config)
        result = bench_config(cfg, iters=args.iters, e2e=args.e2e, e2e_steps=args.steps, config_path=args.config)
    except ConfigError as e:
        print("config error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else format_table(result), flush=True)
    return 1 if any("error" in r for r in result["runs"]) else 0


def cmd_bench(args) -> int:
    import numpy as np
    if args.config:
        return cmd_bench_config(args)
    work = Path(tempfile.mkdtemp(prefix="streamtrace-bench-"))
    rows = []
    print(f"end-to-end round trips: GRU-{args.hidden} engine vs bare ZeroMQ+msgpack echo, "
          f"{args.steps} steps each (after 500 warm-up), one sensor")
    for transport in args.transports:
        for pinned in (False, True):
            cpu = 0 if pinned else None
            for server in ("echo", "engine"):
                ep = (f"ipc://{work}/{server}-{int(pinned)}" if transport == "ipc"
                      else f"tcp://127.0.0.1:{args.port + len(rows)}")
                if server == "echo":
                    proc = start_echo(ep, cpu)
                else:
                    cfg = write_config(work / f"engine-{transport}-{int(pinned)}.toml", {
                        "model": {"stack": "gru", "n_in": 1, "n_hidden": args.hidden, "n_out": 1},
                        "learning": {"algorithm": args.algorithm, "mode": "forecast"},
                        "engine": {"slots": 1, "cpu": cpu if pinned else -1},
                        "sockets": {"router": ep, "pull": "", "pub": ""},
                        "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False}})
                    proc = start_engine(cfg)
                try:
                    lat = _roundtrips(ep, args.steps, cpu)
                finally:
                    stop(proc)
                row = {"server": server, "transport": transport, "pinned": pinned,
                       "p50": float(np.median(lat)), "p99": float(np.percentile(lat, 99))}
                rows.append(row)
                print(f"  {server:6s} {transport} {'pinned to CPU 0' if pinned else 'unpinned':15s} "
                      f"p50 {row['p50']:7.1f} us  p99 {row['p99']:7.1f} us", flush=True)
    lines = ["| transport | CPUs | echo p50 µs | echo p99 µs | engine p50 µs | engine p99 µs | p50 ratio | p99 ratio |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for transport in args.transports:
        for pinned in (False, True):
            e = next(r for r in rows if r["server"] == "echo" and r["transport"] == transport and r["pinned"] == pinned)
            g = next(r for r in rows if r["server"] == "engine" and r["transport"] == transport and r["pinned"] == pinned)
            lines.append(f"| {transport} | {'both on CPU 0' if pinned else 'unpinned'} | {e['p50']:.0f} | "
                         f"{e['p99']:.0f} | {g['p50']:.0f} | {g['p99']:.0f} | {g['p50'] / e['p50']:.2f} | "
                         f"{g['p99'] / e['p99']:.2f} |")
    print("\n" + "\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


# ---- learn (engine-free) ------------------------------------------------------------------
def cmd_learn(args) -> int:
    import numpy as np

    from .learner import OnlineLearner
    from .nn import Stack

    signal = _signal(0, args.steps + 1)
    learner = OnlineLearner(Stack(args.model, 1, args.hidden, 1), np.zeros(1, np.float32), mode="forecast",
                            algorithm=args.algorithm, lr=args.lr)
    print(f"online learning: {args.model.upper()}-{args.hidden}, {args.algorithm}, forecasting a two-tone signal")
    window, losses = max(1, args.steps // 10), []
    for i in range(args.steps):
        losses.append(learner.step(signal[i:i + 1]).loss[0])
        if (i + 1) % window == 0:
            print(f"  step {i + 1:6d}   one-step-ahead MSE {np.nanmean(losses[-window:]):.5f}", flush=True)
    first, last = np.nanmean(losses[1:window + 1]), np.nanmean(losses[-window:])
    print(f"loss fell {first / last:.1f}x ({first:.4f} -> {last:.5f})")
    return 0


def cmd_evaluate(args) -> int:
    from .evaluate import run_cli
    return run_cli(args)


def cmd_replay(args) -> int:
    from .adapters.replay import run_cli
    return run_cli(args)


BUSES = {"lsl": "Lab Streaming Layer: forward an LSL stream to an engine, predictions back as an LSL outlet",
         "mqtt": "MQTT: forward device topics to an engine, predictions back on mirrored topics"}


def cmd_bridge(args) -> int:
    import importlib
    return importlib.import_module(f"streamtrace.adapters.{args.bus}").run_cli(args)


def _bridge_parsers(sub):
    import importlib
    p = sub.add_parser("bridge", help="connect a sensor bus (LSL, MQTT) to an engine, predictions back on the bus")
    buses = p.add_subparsers(dest="bus", required=True)
    for bus, text in BUSES.items():
        b = buses.add_parser(bus, help=text, description=text)
        b.add_argument("--config", default=None, help="TOML: [bridge.%s] settings; the engine endpoint from "
                       "[sockets] router (the serve config works)" % bus)
        b.add_argument("--endpoint", default=None, help="the engine's router (default: the config's, or "
                       "tcp://127.0.0.1:5555)")
        # each bridge module names its own flags; it imports its bus library only when it runs
        importlib.import_module(f"streamtrace.adapters.{bus}").add_arguments(b)
        b.set_defaults(func=cmd_bridge)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="streamtrace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the streaming engine")
    p.add_argument("--config", default=None, help="TOML config file (defaults for anything missing)")
    p.set_defaults(func=cmd_serve)
    from .cluster.cli import add_parsers as cluster_parsers   # worker, cluster up | status (streamtrace[cluster])
    cluster_parsers(sub)
    for name, func, steps in (("demo", cmd_demo, 3000), ("learn", cmd_learn, 4000)):
        p = sub.add_parser(name, help={"demo": "an engine and synthetic sensor streams, live progress",
                                       "learn": "the engine-free online learning demo"}[name])
        p.add_argument("--model", default="gru", help="built-in stack: gru, lstm, rnn, lif, alif, leaky")
        p.add_argument("--hidden", type=int, default=32)
        p.add_argument("--algorithm", default="d-rtrl", choices=["d-rtrl", "es-d-rtrl", "rtrl"])
        p.add_argument("--lr", type=float, default=1e-3)
        p.add_argument("--steps", type=int, default=steps)
        if name == "demo":
            p.add_argument("--streams", type=int, default=4)
            p.add_argument("--plot", default="streamtrace-demo.png", help="PNG path ('' for none)")
        p.set_defaults(func=func)
    p = sub.add_parser("bench", help="end-to-end latency against the ZeroMQ echo floor; --config: your model")
    p.add_argument("--config", default=None, help="time this serve TOML's model: compile, step p50/p99 per "
                   "algorithm and slot count, trace memory per slot, the dispatch floor")
    p.add_argument("--json", action="store_true", help="with --config: print the results as JSON")
    p.add_argument("--e2e", action="store_true", help="with --config: also the end-to-end round trip vs the echo")
    p.add_argument("--iters", type=int, default=1000, help="with --config: timed steps per run")
    p.add_argument("--steps", type=int, default=20000, help="round trips per end-to-end run")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--algorithm", default="d-rtrl")
    p.add_argument("--transports", nargs="+", default=["ipc", "tcp"], choices=["ipc", "tcp"])
    p.add_argument("--port", type=int, default=47100)
    p.add_argument("--out", default="", help="write the markdown table here")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("evaluate", help="prequential one-step-ahead quality of a config on a task or file")
    p.add_argument("task", nargs="?", default="mackey-glass",
                   help="mackey-glass, narma10, lorenz, co2, sunspots, or a .csv/.npy file")
    p.add_argument("--config", default=None, help="TOML config as serve takes (default: the forecast default)")
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--window", type=int, default=1000, help="score the last W steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="", help="write a PNG of predictions and error")
    p.set_defaults(func=cmd_evaluate)
    p = sub.add_parser("replay", help="send a recorded CSV/NPY/Parquet file to an engine and score its predictions")
    p.add_argument("file", help="a .csv (header row optional), .npy or .parquet file; one row per time step")
    p.add_argument("--endpoint", default=None, help="the engine's router (default tcp://127.0.0.1:5555, "
                                                   "or sockets.router of --serve's config)")
    p.add_argument("--nats", default=None, metavar="URL", help="send to a cluster through NATS instead "
                   "(nats://[token@]host:port; streamtrace[cluster])")
    p.add_argument("--stream", default=None, help="stream id (default: the file name without suffix)")
    p.add_argument("--columns", default=None, help="input columns, by name or position: a,b (default: "
                                                  "every numeric column but the time and target columns)")
    p.add_argument("--target-columns", default=None, help="targets sent as y (supervised engine): y1,y2")
    p.add_argument("--time-column", default=None, help="timestamps (seconds or ISO 8601), for --realtime")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--rate", type=float, default=None, help="rows per second (default: as fast as possible)")
    pace.add_argument("--realtime", action="store_true", help="pace by the time column's steps")
    p.add_argument("--window", type=int, default=0, help="score the last W steps (0: all)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one answer")
    p.add_argument("--plot", default="", help="write a PNG of predictions against targets")
    p.add_argument("--out", default="", help="write every prediction with its row (.csv, or .npy)")
    p.add_argument("--serve", default=None, metavar="CONFIG",
                   help="start an engine with this TOML config for the replay, and stop it afterwards")
    p.set_defaults(func=cmd_replay)
    _bridge_parsers(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
