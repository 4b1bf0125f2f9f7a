"""Command line: streamtrace COMMAND (streamtrace COMMAND --help for its options).

  serve      run the streaming engine (TOML config; every key has a default that just works)
  dashboard  a live read-only web page of a running engine (signal vs prediction per stream,
             errors, latency), fed by its PUB socket; serve --dashboard HOST:PORT starts one too
  demo       start an engine and several synthetic sensor streams on loopback, show live
             progress, end with a summary table and a PNG plot
  learn      the engine-free online learning demo (one process, loss printed as it falls)
  bench      end-to-end latency: sensor -> engine -> prediction round trips, with a bare ZeroMQ +
             msgpack echo server (the transport floor) measured in the same run; with --config
             FILE, your own model: compile time, step p50/p99, trace memory, the dispatch floor
  evaluate   prequential one-step-ahead quality of a config on a task or a CSV/NPY/Parquet file
  replay     send a recorded CSV/NPY/Parquet file to an engine row by row and score its predictions
  bridge     connect a sensor bus (bridge lsl, bridge mqtt) to an engine, predictions back on the bus
  export     compile a learner ahead of time for the jax-free runner on a device (docs/devices.md)
  worker     join a NATS JetStream cluster as a worker (streamtrace[cluster]; docs/cluster.md)
  cluster    cluster up: a local NATS server and workers; cluster status: who owns what

Every bad argument is one line on stderr and exit status 2 (streamtrace.arguments.Parser).
"""
from __future__ import annotations

import importlib
import sys

from .. import __version__
from ..arguments import (STACK_CHOICES, Parser, existing_file, frequency, index_list, nonnegative_float,
                        nonnegative_int, output_file, port, positive_float, positive_int)

__all__ = ["main", "build_parser"]


# Each command is one module's ``run_cli(args)``, imported only when that command runs (so
# ``streamtrace --help`` and a bridge do not load jax).
COMMANDS = {"serve": "streamtrace.commands.serve", "dashboard": "streamtrace.dashboard.command",
            "demo": "streamtrace.commands.demo", "learn": "streamtrace.commands.learn_demo",
            "bench": "streamtrace.commands.bench", "evaluate": "streamtrace.evaluation.scoring",
            "replay": "streamtrace.adapters.replay"}
ALGORITHMS = ["d-rtrl", "es-d-rtrl", "rtrl"]
DESCRIPTION = "streamtrace: online learning on streaming signals, one time step at a time."


def _run(args) -> int:
    module = COMMANDS.get(args.command) or f"streamtrace.adapters.{args.bus}"
    if args.command == "evaluate" and args.horizon > 1:         # scored per lead
        module = "streamtrace.evaluation.leads"
    return importlib.import_module(module).run_cli(args)


BUSES = {"lsl": "Lab Streaming Layer: forward an LSL stream to an engine, predictions back as an LSL outlet",
         "mqtt": "MQTT: forward device topics to an engine, predictions back on mirrored topics"}


def _bridge_parsers(sub):
    from ..cluster.cli import credential_args      # the NATS flags of --nats (no NATS import here)
    text = "connect a sensor bus (LSL, MQTT) to an engine, predictions back on the bus"
    p = sub.add_parser("bridge", help=text, description=text)
    buses = p.add_subparsers(dest="bus", required=True, metavar="BUS")
    for bus, text in BUSES.items():
        b = buses.add_parser(bus, help=text, description=text)
        b.add_argument("--config", type=existing_file, default=None, help="TOML: [bridge.%s] settings; the "
                       "engine endpoint from [sockets] router (the serve config works)" % bus)
        b.add_argument("--endpoint", default=None, help="the engine's router (default: the config's, or "
                       "tcp://127.0.0.1:5555)")
        b.add_argument("--nats", default=None, metavar="URL", help="send to a cluster through NATS instead "
                       "(nats://host:port; streamtrace[cluster]; docs/cluster.md)")
        credential_args(b)
        # each bridge module names its own flags; it imports its bus library only when it runs
        importlib.import_module(f"streamtrace.adapters.{bus}").add_arguments(b)
        b.set_defaults(func=_run)


def _serve_parser(sub):
    """``serve``, optionally with a live dashboard beside it."""
    from ..dashboard.command import listen_address
    p = sub.add_parser("serve", help="run the streaming engine", description="run the streaming engine")
    p.add_argument("--config", type=existing_file, default=None, help="TOML config file (default: none, the "
                   "documented defaults; any key missing takes its default)")
    p.add_argument("--dashboard", type=listen_address, default=None, metavar="HOST:PORT",
                   help="also serve the live dashboard here (127.0.0.1:8750 for loopback; default: none)")
    p.add_argument("--dashboard-token", default=None, help="required beyond loopback "
                   "(or STREAMTRACE_DASHBOARD_TOKEN)")
    p.add_argument("--dashboard-allow-anonymous", action="store_true",
                   help="beyond loopback without a token: anyone who reaches it reads every stream")
    p.set_defaults(func=_run)


def _dashboard_parser(sub):
    from ..dashboard.command import add_parser
    add_parser(sub, _run)


def _demo_learn_parser(sub, name: str):
    """``demo`` (an engine and sensor streams) or ``learn`` (the engine-free learner)."""
    from ..dashboard.command import listen_address
    steps = {"demo": 3000, "learn": 4000}[name]
    text = {"demo": "an engine and synthetic sensor streams, live progress, a summary and a plot",
            "learn": "the engine-free online learning demo"}[name]
    p = sub.add_parser(name, help=text, description=text)
    demo = name == "demo"      # the demo serves the default learner unless a stack is named
    p.add_argument("--model", default=None if demo else "gru", choices=STACK_CHOICES,
                   help="built-in stack" + (" (default: the default learner, see README)" if demo else ""))
    p.add_argument("--hidden", type=positive_int, default=None if demo else 32, help="hidden units" +
                   (" (default: 32 with --model, else the default learner's)" if demo else ""))
    p.add_argument("--algorithm", default=None if demo else "d-rtrl", choices=ALGORITHMS,
                   help="learning algorithm" + (" (default: d-rtrl with --model)" if demo else ""))
    p.add_argument("--lr", type=positive_float, default=None if demo else 1e-3,
                   help="learning rate" + (" (default: the learner's)" if demo else ""))
    p.add_argument("--steps", type=positive_int, default=steps, help="time steps" + (" per stream" if demo else ""))
    if demo:
        p.add_argument("--streams", type=positive_int, default=4, help="synthetic sensor streams")
        p.add_argument("--plot", type=output_file, default="streamtrace-demo.png", help="PNG path ('' for none)")
        p.add_argument("--dashboard", type=listen_address, default=("127.0.0.1", 8750), metavar="HOST:PORT",
                       help="serve the live dashboard here while the demo runs (loopback; default "
                       "127.0.0.1:8750)")
        p.add_argument("--no-dashboard", dest="dashboard", action="store_const", const=None,
                       help="no dashboard")
    p.set_defaults(func=_run)


def _bench_parser(sub):
    text = "end-to-end latency against the ZeroMQ echo floor; --config: your model"
    p = sub.add_parser("bench", help=text, description=text)
    p.add_argument("--config", type=existing_file, default=None, help="time this serve TOML's model: compile, "
                   "step p50/p99 per algorithm and slot count, trace memory per slot, the dispatch floor "
                   "(default: none, the latency table)")
    p.add_argument("--json", action="store_true", help="with --config: print the results as JSON")
    p.add_argument("--e2e", action="store_true", help="with --config: also the end-to-end round trip vs the echo")
    p.add_argument("--iters", type=positive_int, default=1000, help="with --config: timed steps per run")
    p.add_argument("--steps", type=positive_int, default=20000, help="round trips per end-to-end run")
    p.add_argument("--period-us", type=nonnegative_float, default=0.0, help="end to end: a request every "
                   "this many microseconds, as a sensor sampling at that rate sends (default 0: back to back)")
    p.add_argument("--hidden", type=positive_int, default=64, help="hidden units of the timed GRU")
    p.add_argument("--algorithm", default="d-rtrl", choices=ALGORITHMS, help="learning algorithm timed")
    p.add_argument("--transports", nargs="+", default=["ipc", "tcp"], choices=["ipc", "tcp"],
                   help="ZeroMQ transports measured")
    p.add_argument("--port", type=port, default=47100, help="first TCP port used")
    p.add_argument("--out", type=output_file, default="", help="write the markdown table here (default '': nowhere)")
    p.set_defaults(func=_run)


COLUMNS_HELP = "input columns, by name or position: a,b (default: every numeric column but the time, " \
               "target and time-like ones)"


def _lead_args(p, what: str):
    """--horizon and --period of evaluate and replay: scored per lead (streamtrace/evaluation/leads.py)."""
    p.add_argument("--horizon", type=positive_int, default=1, help=f"{what}: score each lead beside "
                   "persistence (and the seasonal naive forecast with --period) at that lead")
    p.add_argument("--period", type=nonnegative_int, default=0,
                   help="with --horizon: the seasonal naive forecast's period in samples (default 0: none)")


def _evaluate_parser(sub):
    text = "prequential one-step-ahead quality of a config on a task or file"
    p = sub.add_parser("evaluate", help=text, description=text)
    p.add_argument("task", nargs="?", default="mackey-glass",
                   help="mackey-glass, narma10, lorenz, co2, sunspots, multichannel, regime-switch, "
                   "delay-recall[:D] (recall the input D steps back, default 15), or a .csv/.npy/.parquet file")
    p.add_argument("--config", type=existing_file, default=None, help="TOML config as serve takes (default: "
                   "the forecast default); learning.channels forecasts those input columns only")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="default 25000 for multichannel, regime-switch, delay-recall; 6000 otherwise")
    p.add_argument("--window", type=positive_int, default=1000,
                   help="score the last W steps (regime-switch scores its own span: steps 3500..4499)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of generated tasks and of the model")
    _lead_args(p, "forecast H steps ahead")
    p.add_argument("--plot", type=output_file, default="",
                   help="write a PNG of predictions and error (default '': none)")
    files = p.add_argument_group("a file's columns")
    files.add_argument("--columns", default=None, help=COLUMNS_HELP)
    files.add_argument("--target", "--target-columns", dest="target", default=None, metavar="COLS",
                       help="supervised: predict these columns from the inputs (default: none, a forecast)")
    files.add_argument("--time-column", default=None, help="a time column, left out of the inputs (default: "
                       "none named; a numeric column that looks like time is left out, and said so)")
    p.set_defaults(func=_run)


def _replay_parser(sub):
    from ..cluster.cli import credential_args
    text = "send a recorded CSV/NPY/Parquet file to an engine and score its predictions"
    p = sub.add_parser("replay", help=text, description=text)
    p.add_argument("file", help="a .csv (header row optional), .npy or .parquet file; one row per time step")
    p.add_argument("--endpoint", default=None, help="the engine's router (default tcp://127.0.0.1:5555, "
                                                   "or sockets.router of --serve's config)")
    p.add_argument("--nats", default=None, metavar="URL", help="send to a cluster through NATS instead "
                   "(nats://[token@]host:port; streamtrace[cluster])")
    credential_args(p)
    p.add_argument("--stream", default=None, help="stream id (default: the file name without suffix)")
    p.add_argument("--columns", default=None, help=COLUMNS_HELP)
    p.add_argument("--target", "--target-columns", dest="target_columns", default=None, metavar="COLS",
                   help="targets sent as y to a supervised engine: y1,y2 (default: none, a forecast)")
    p.add_argument("--time-column", default=None, help="timestamps (seconds or ISO 8601), for --realtime "
                   "(default: none named)")
    p.add_argument("--channels", type=index_list, default=None, metavar="I,J",
                   help="the inputs (positions among them) a forecast engine predicts, its learning.channels "
                   "(default: those of --serve's config, else all)")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--rate", type=frequency, default=None,
                      help="rows per second: a number or a frequency such as '250 Hz' (default: as fast as possible)")
    pace.add_argument("--realtime", action="store_true", help="pace by the time column's steps")
    _lead_args(p, "an engine forecasting H steps ahead (its learning.horizon)")
    p.add_argument("--window", type=nonnegative_int, default=1000,
                   help="score the last W steps, as evaluate does (0: all)")
    p.add_argument("--timeout", type=positive_float, default=60.0, help="seconds to wait for one answer")
    p.add_argument("--plot", type=output_file, default="",
                   help="write a PNG of predictions against targets (default '': none)")
    p.add_argument("--out", type=output_file, default="",
                   help="write every prediction with its row (.csv, or .npy; default '': none)")
    p.add_argument("--serve", type=existing_file, default=None, metavar="CONFIG",
                   help="start an engine with this TOML config for the replay, and stop it afterwards (default: none)")
    p.add_argument("--units", default=None, help="the input columns' units, comma-separated (e.g. uV,uV), "
                   "converted into the [stream] units of --serve's config (default: already in them)")
    p.set_defaults(func=_run)


def _export_parser(sub):
    from ..export.cli import add_parser
    add_parser(sub)


def _cluster_parsers(sub):
    from ..cluster.cli import add_parsers      # worker, cluster up | status (streamtrace[cluster])
    add_parsers(sub)


# each command's parser, built only when it runs (or for the top-level --help); in the order
# --help lists them
PARSERS = {"serve": _serve_parser, "dashboard": _dashboard_parser,
           "demo": lambda sub: _demo_learn_parser(sub, "demo"), "learn": lambda sub: _demo_learn_parser(sub, "learn"),
           "bench": _bench_parser, "evaluate": _evaluate_parser, "replay": _replay_parser, "export": _export_parser,
           "bridge": _bridge_parsers, "worker": _cluster_parsers, "cluster": _cluster_parsers}


def build_parser(command: str | None = None) -> Parser:
    """The ``streamtrace`` parser (a :class:`~streamtrace.arguments.Parser`: one-line errors, exit
    status 2) with ``command``'s parser only, or every command's (None, or a name it does not
    know: then argparse names the choices).

    Parameters
    ----------
    command : str, optional
        The command about to run: only its parser (and the modules it needs) is built.

    >>> build_parser("learn").parse_args(["learn", "--steps", "10"]).steps
    10
    """
    parser = Parser(prog="streamtrace", description=DESCRIPTION,
                    epilog="streamtrace COMMAND --help shows a command's options and their defaults.")
    parser.add_argument("--version", action="version", version=f"streamtrace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    adders = [PARSERS[command]] if command in PARSERS else list(dict.fromkeys(PARSERS.values()))
    for add in adders:
        add(sub)
    return parser


def _command_of(argv) -> str | None:
    """The command ``argv`` names: its first word, unless that is an option (``--help``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return argv[0] if argv and not argv[0].startswith("-") else None


def main(argv=None) -> int:
    """Run ``streamtrace`` with ``argv`` (default: the process's); the command's exit status
    (2 for a bad argument, after one line on stderr; 0 after --help or --version).

    Example: ``main(["evaluate", "narma10", "--steps", "300"])`` prints a table and returns 0."""
    try:
        args = build_parser(_command_of(argv)).parse_args(argv)
    except SystemExit as e:          # argparse's exit: --help, --version, or a bad argument
        return e.code if isinstance(e.code, int) else 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
