"""Command line: ``streamtrace serve | dashboard | demo | bench | learn | evaluate | replay``.

serve   run the streaming engine (TOML config; every key has a default that just works)
dashboard  a live read-only web page of a running engine (signal vs prediction per stream,
        errors, latency), fed by its PUB socket; ``serve --dashboard HOST:PORT`` starts one too
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
import importlib
import sys

from .dashboard.command import add_parser as add_dashboard_parser, listen_address

__all__ = ["main"]


# Each command is one module's ``run_cli(args)``, imported only when that command runs (so
# ``streamtrace --help`` and a bridge do not load jax).
COMMANDS = {"serve": "streamtrace.serve", "dashboard": "streamtrace.dashboard.command", "demo": "streamtrace.demo",
            "learn": "streamtrace.learn", "bench": "streamtrace.latency", "evaluate": "streamtrace.evaluate",
            "replay": "streamtrace.adapters.replay"}


def _run(args) -> int:
    module = COMMANDS.get(args.command) or f"streamtrace.adapters.{args.bus}"
    return importlib.import_module(module).run_cli(args)


BUSES = {"lsl": "Lab Streaming Layer: forward an LSL stream to an engine, predictions back as an LSL outlet",
         "mqtt": "MQTT: forward device topics to an engine, predictions back on mirrored topics"}


def _bridge_parsers(sub):
    from .cluster.cli import credential_args      # the NATS flags of --nats (no NATS import here)
    p = sub.add_parser("bridge", help="connect a sensor bus (LSL, MQTT) to an engine, predictions back on the bus")
    buses = p.add_subparsers(dest="bus", required=True)
    for bus, text in BUSES.items():
        b = buses.add_parser(bus, help=text, description=text)
        b.add_argument("--config", default=None, help="TOML: [bridge.%s] settings; the engine endpoint from "
                       "[sockets] router (the serve config works)" % bus)
        b.add_argument("--endpoint", default=None, help="the engine's router (default: the config's, or "
                       "tcp://127.0.0.1:5555)")
        b.add_argument("--nats", default=None, metavar="URL", help="send to a cluster through NATS instead "
                       "(nats://host:port; streamtrace[cluster]; docs/cluster.md)")
        credential_args(b)
        # each bridge module names its own flags; it imports its bus library only when it runs
        importlib.import_module(f"streamtrace.adapters.{bus}").add_arguments(b)
        b.set_defaults(func=_run)


def _serve_parsers(sub):
    """``serve`` (optionally with a live dashboard beside it) and ``dashboard``."""
    p = sub.add_parser("serve", help="run the streaming engine")
    p.add_argument("--config", default=None, help="TOML config file (defaults for anything missing)")
    p.add_argument("--dashboard", type=listen_address, default=None, metavar="HOST:PORT",
                   help="also serve the live dashboard here (127.0.0.1:8750 for loopback)")
    p.add_argument("--dashboard-token", default=None, help="required beyond loopback "
                   "(or STREAMTRACE_DASHBOARD_TOKEN)")
    p.add_argument("--dashboard-allow-anonymous", action="store_true",
                   help="beyond loopback without a token: anyone who reaches it reads every stream")
    p.set_defaults(func=_run)
    add_dashboard_parser(sub, _run)


def _bench_parser(sub):
    p = sub.add_parser("bench", help="end-to-end latency against the ZeroMQ echo floor; --config: your model")
    p.add_argument("--config", default=None, help="time this serve TOML's model: compile, step p50/p99 per "
                   "algorithm and slot count, trace memory per slot, the dispatch floor")
    p.add_argument("--json", action="store_true", help="with --config: print the results as JSON")
    p.add_argument("--e2e", action="store_true", help="with --config: also the end-to-end round trip vs the echo")
    p.add_argument("--iters", type=int, default=1000, help="with --config: timed steps per run")
    p.add_argument("--steps", type=int, default=20000, help="round trips per end-to-end run")
    p.add_argument("--period-us", type=float, default=0.0, help="end to end: a request every this many "
                   "microseconds, as a sensor sampling at that rate sends (default 0: back to back)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--algorithm", default="d-rtrl")
    p.add_argument("--transports", nargs="+", default=["ipc", "tcp"], choices=["ipc", "tcp"])
    p.add_argument("--port", type=int, default=47100)
    p.add_argument("--out", default="", help="write the markdown table here")
    p.set_defaults(func=_run)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="streamtrace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parsers(sub)
    from .cluster.cli import add_parsers as cluster_parsers   # worker, cluster up | status (streamtrace[cluster])
    cluster_parsers(sub)
    for name, steps in (("demo", 3000), ("learn", 4000)):
        p = sub.add_parser(name, help={"demo": "an engine and synthetic sensor streams, live progress",
                                       "learn": "the engine-free online learning demo"}[name])
        demo = name == "demo"      # the demo serves the default learner unless a stack is named
        p.add_argument("--model", default=None if demo else "gru",
                       help="built-in stack: gru, lstm, rnn, lif, alif, leaky" +
                       (" (default: the default learner, see README)" if demo else ""))
        p.add_argument("--hidden", type=int, default=None if demo else 32)
        p.add_argument("--algorithm", default=None if demo else "d-rtrl", choices=["d-rtrl", "es-d-rtrl", "rtrl"])
        p.add_argument("--lr", type=float, default=None if demo else 1e-3)
        p.add_argument("--steps", type=int, default=steps)
        if name == "demo":
            p.add_argument("--streams", type=int, default=4)
            p.add_argument("--plot", default="streamtrace-demo.png", help="PNG path ('' for none)")
            p.add_argument("--dashboard", type=listen_address, default=("127.0.0.1", 8750), metavar="HOST:PORT",
                           help="serve the live dashboard here while the demo runs (loopback)")
            p.add_argument("--no-dashboard", dest="dashboard", action="store_const", const=None)
        p.set_defaults(func=_run)
    _bench_parser(sub)
    p = sub.add_parser("evaluate", help="prequential one-step-ahead quality of a config on a task or file")
    p.add_argument("task", nargs="?", default="mackey-glass",
                   help="mackey-glass, narma10, lorenz, co2, sunspots, multichannel, regime-switch, "
                   "delay-recall[:D] (recall the input D steps back, default 15), or a .csv/.npy file")
    p.add_argument("--config", default=None, help="TOML config as serve takes (default: the forecast default)")
    p.add_argument("--steps", type=int, default=None,
                   help="default 25000 for multichannel, regime-switch, delay-recall; 6000 otherwise")
    p.add_argument("--window", type=int, default=1000,
                   help="score the last W steps (regime-switch scores its own span: steps 3500..4499)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="", help="write a PNG of predictions and error")
    p.set_defaults(func=_run)
    p = sub.add_parser("replay", help="send a recorded CSV/NPY/Parquet file to an engine and score its predictions")
    p.add_argument("file", help="a .csv (header row optional), .npy or .parquet file; one row per time step")
    p.add_argument("--endpoint", default=None, help="the engine's router (default tcp://127.0.0.1:5555, "
                                                   "or sockets.router of --serve's config)")
    p.add_argument("--nats", default=None, metavar="URL", help="send to a cluster through NATS instead "
                   "(nats://[token@]host:port; streamtrace[cluster])")
    from .cluster.cli import credential_args
    credential_args(p)
    p.add_argument("--stream", default=None, help="stream id (default: the file name without suffix)")
    p.add_argument("--columns", default=None, help="input columns, by name or position: a,b (default: "
                                                  "every numeric column but the time and target columns)")
    p.add_argument("--target-columns", default=None, help="targets sent as y (supervised engine): y1,y2")
    p.add_argument("--time-column", default=None, help="timestamps (seconds or ISO 8601), for --realtime")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--rate", default=None, help="rows per second, a number or a frequency such as '250 Hz' "
                                                   "(default: as fast as possible)")
    pace.add_argument("--realtime", action="store_true", help="pace by the time column's steps")
    p.add_argument("--window", type=int, default=1000, help="score the last W steps, as evaluate does (0: all)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one answer")
    p.add_argument("--plot", default="", help="write a PNG of predictions against targets")
    p.add_argument("--out", default="", help="write every prediction with its row (.csv, or .npy)")
    p.add_argument("--serve", default=None, metavar="CONFIG",
                   help="start an engine with this TOML config for the replay, and stop it afterwards")
    p.add_argument("--units", default=None, help="the input columns' units, comma-separated (e.g. uV,uV): "
                   "converted into the [stream] units of --serve's config (default: already in them)")
    p.set_defaults(func=_run)
    _bridge_parsers(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
