"""`streamtrace dashboard` and `serve --dashboard`: the command line of the live page (the page
itself is ``server.py``, fed by ``feed.py``; who may read it, ``access.py``)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

__all__ = ["add_parser", "listen_address", "start_dashboard", "demo_dashboard", "run_cli"]


def add_parser(sub, run):
    """The ``dashboard`` command."""
    from ..arguments import existing_file, positive_float, positive_int
    text = "a live read-only web page of an engine (needs streamtrace[dashboard])"
    p = sub.add_parser("dashboard", help=text, description=text)
    p.add_argument("--pub", default=None, help="the engine's PUB endpoint (default: sockets.pub of --config)")
    p.add_argument("--config", type=existing_file, default=None,
                   help="the engine's TOML config, for its PUB endpoint (default: none)")
    p.add_argument("--listen", type=listen_address, default=("127.0.0.1", 8750), metavar="HOST:PORT",
                   help="where the page is served (default 127.0.0.1:8750; port 0: any free port)")
    p.add_argument("--token", default=None, help="required beyond loopback (or STREAMTRACE_DASHBOARD_TOKEN)")
    p.add_argument("--allow-anonymous", action="store_true",
                   help="beyond loopback without a token: anyone who reaches it reads every stream")
    p.add_argument("--rate", type=positive_float, default=10.0, help="page updates per second")
    p.add_argument("--points", type=positive_int, default=2000,
                   help="points kept per stream (the page gets them thinned)")
    p.set_defaults(func=run)


def listen_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def die_with_parent():
    """In the child: SIGTERM when the parent dies, even killed (Linux; elsewhere nothing)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_dashboard(cfg, listen: tuple[str, int], token: str | None, allow_anonymous: bool) -> subprocess.Popen:
    """``streamtrace dashboard`` in a child process (its own interpreter: the engine's loop never
    shares a GIL with the web server), reading this engine's PUB socket; returns once it listens."""
    from .access import DashboardError, check_exposure, connect_address
    if cfg.security.curve_secret_key_file:
        raise DashboardError("--dashboard", "the engine's sockets use CURVE; the dashboard cannot subscribe yet")
    if not cfg.sockets.pub:
        raise DashboardError("--dashboard", "sockets.pub is off: the dashboard has nothing to read")
    token = token or os.environ.get("STREAMTRACE_DASHBOARD_TOKEN")
    check_exposure(listen[0], token, allow_anonymous, announce=lambda s: print(s, flush=True))
    cmd = [sys.executable, "-m", "streamtrace", "dashboard", "--pub", connect_address(cfg.sockets.pub),
           "--listen", f"{listen[0]}:{listen[1]}"] + (["--allow-anonymous"] if allow_anonymous else [])
    env = {**os.environ, **({"STREAMTRACE_DASHBOARD_TOKEN": token} if token else {})}   # not on argv (ps)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=die_with_parent)
    for line in proc.stdout:
        print(line.rstrip(), flush=True)
        if line.startswith("streamtrace dashboard:"):
            return proc
    raise RuntimeError(f"the dashboard exited with code {proc.wait()} before listening")


def run_cli(args) -> int:
    try:
        from .web import run
    except ImportError as e:
        print(f"the dashboard needs the optional extra: pip install 'streamtrace[dashboard]' ({e})", file=sys.stderr)
        return 2
    from .access import DashboardError, connect_address
    pub = args.pub
    if pub is None:
        from ..engine import ConfigError, load_config
        try:
            pub = connect_address(load_config(args.config).sockets.pub)
        except ConfigError as e:
            print("config error: " + " ".join(str(e).split()), file=sys.stderr)
            return 2
    token = args.token or os.environ.get("STREAMTRACE_DASHBOARD_TOKEN")
    try:
        if not 0.1 <= args.rate <= 50:
            raise DashboardError("--rate", f"{args.rate}: page updates per second must be within 0.1..50")
        if not 10 <= args.points <= 1_000_000:
            raise DashboardError("--points", f"{args.points}: points kept per stream must be within 10..1000000")
        return run(pub, *args.listen, token=token, allow_anonymous=args.allow_anonymous, rate_hz=args.rate,
                   points=args.points, announce=lambda s: print(s, flush=True))
    except DashboardError as e:
        print(f"dashboard error: {e}", file=sys.stderr)
        return 2


def demo_dashboard(pub: str, listen: tuple[str, int]):
    """The demo's dashboard on loopback (its URL printed), or None when the extra is missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("  (no live dashboard: pip install 'streamtrace[dashboard]' for one)")
        return None
    proc = subprocess.Popen([sys.executable, "-m", "streamtrace", "dashboard", "--pub", pub, "--listen",
                             f"{listen[0]}:{listen[1]}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("streamtrace dashboard:"):
            print(f"  live dashboard: {line.split()[2]}  (open it in a browser while the demo runs)", flush=True)
            return proc
    print(f"  (the dashboard did not start: exit code {proc.wait()})")
    return None
