"""``streamtrace-runner FOLDER [--config serve.toml] [--router ADDR] ...``: serve an exported learner.

The settings come from the serve config's ``[sockets]``, ``[engine] max_message_bytes``,
``[publish]``, ``[checkpoint]`` and ``[security]`` tables (read with ``tomllib``: no jax), then
from the flags. Bad arguments and bad folders are one line on stderr and exit status 2.

>>> settings_from({"sockets": {"router": "ipc:///tmp/r"}, "checkpoint": {"dir": "ck"}}, {}).checkpoint_dir
'ck'
"""
from __future__ import annotations

import argparse
import sys
import tomllib

from .server import RunnerServer, RunnerSettings

__all__ = ["main", "settings_from"]

# (table, key) of the serve config -> RunnerSettings field
_KEYS = {("sockets", "router"): "router", ("sockets", "pull"): "pull", ("sockets", "pub"): "pub",
         ("sockets", "hwm"): "hwm", ("engine", "max_message_bytes"): "max_message_bytes",
         ("checkpoint", "dir"): "checkpoint_dir", ("checkpoint", "every"): "checkpoint_every",
         ("checkpoint", "keep"): "keep", ("publish", "stats_every_s"): "stats_every_s",
         ("publish", "weights_every"): "weights_every",
         ("security", "curve_secret_key_file"): "curve_secret_key_file",
         ("security", "curve_authorized_dir"): "curve_authorized_dir",
         ("security", "allow_any_client"): "allow_any_client"}


def settings_from(config: dict, flags: dict) -> RunnerSettings:
    """``RunnerSettings`` from a parsed serve config and then the flags given (None: not given);
    a value of the wrong type is a ``ValueError`` naming its key."""
    out = RunnerSettings()
    for (table, key), field in _KEYS.items():
        if key in config.get(table, {}):
            value, want = config[table][key], type(getattr(out, field))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ValueError(f"{table}.{key}: must be {want.__name__}; got {value!r}")
            setattr(out, field, value)
    for field, value in flags.items():
        if value is not None:
            setattr(out, field, value)
    if out.curve_secret_key_file and not (out.curve_authorized_dir or out.allow_any_client):
        raise ValueError("security.curve_authorized_dir: required with a server key (or allow_any_client)")
    return out


class _Parser(argparse.ArgumentParser):
    """One line on stderr and exit status 2 for a bad argument."""

    def error(self, message):
        self.exit(2, f"streamtrace-runner: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="streamtrace-runner", description="serve an exported learner (streamtrace "
                                "export) over the wire protocol of streamtrace serve, without jax")
    p.add_argument("folder", help="the folder streamtrace export wrote")
    p.add_argument("--config", default=None, help="a serve TOML: its [sockets], [checkpoint], [security], "
                   "[publish] and engine.max_message_bytes (default: none, loopback port 5555)")
    for flag, field in (("--router", "router"), ("--pull", "pull"), ("--pub", "pub"),
                        ("--checkpoint-dir", "checkpoint_dir")):
        p.add_argument(flag, dest=field, default=None, help=f"overrides the config's {field.replace('_', ' ')}")
    p.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=None, help="steps")
    return p


def main(argv=None) -> int:
    """Run the runner's command line; its exit status."""
    args = _parser().parse_args(argv)
    from .runner import Runner, RunnerError
    from .sockets import BindError
    from ..checkpoints import CheckpointError
    try:
        config = tomllib.loads(open(args.config).read()) if args.config else {}
        flags = {k: v for k, v in vars(args).items() if k not in ("folder", "config")}
        server = RunnerServer(Runner(args.folder), settings_from(config, flags))
    except (OSError, ValueError, tomllib.TOMLDecodeError, RunnerError, CheckpointError, BindError) as e:
        print(f"streamtrace-runner: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    where = ", ".join(f"{k} {v}" for k, v in server.endpoints.items())
    resumed = f"; resumed from {server.resumed['path']}" if server.resumed else ""
    print(f"streamtrace runner: {args.folder} on {where}{resumed}", flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
