"""`streamtrace serve [--dashboard HOST:PORT]`: the engine, and optionally its live page beside it
(in a process of its own)."""
from __future__ import annotations

import sys

__all__ = ["run_cli"]


def run_cli(args) -> int:
    """``streamtrace serve [--dashboard HOST:PORT]``."""
    from ..engine import ConfigError, load_config, serve
    from ..engine.launch import stop
    from ..dashboard.access import DashboardError
    from ..dashboard.command import start_dashboard
    board = None
    try:
        cfg = load_config(args.config)
        if args.dashboard:
            board = start_dashboard(cfg, args.dashboard, args.dashboard_token, args.dashboard_allow_anonymous)
        return serve(cfg, announce=lambda s: print(s, flush=True))
    except ConfigError as e:   # one line, no traceback: every bad value names its key
        print("config error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except DashboardError as e:
        print(f"dashboard error: {e}", file=sys.stderr)
        return 2
    finally:
        if board is not None:
            stop(board, 5)
