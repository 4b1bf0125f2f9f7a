"""``streamtrace export --config FILE --out DIR [--target host|x86_64|aarch64] [--slots N]``."""
from __future__ import annotations

import sys

__all__ = ["add_parser", "run_cli"]

TARGET_NAMES = ("host", "x86_64", "aarch64")     # targets.TARGETS' keys, without importing it


def add_parser(sub):
    """Add the ``export`` command to the ``streamtrace`` subparsers ``sub``."""
    from ..arguments import existing_file, positive_int
    text = "compile a learner ahead of time for the jax-free runner (IREE; x86-64, 64-bit ARM)"
    p = sub.add_parser("export", help=text, description=text)
    p.add_argument("--config", type=existing_file, default=None, help="TOML config as serve takes (default: the default learner)")
    p.add_argument("--out", required=True, help="the folder to write (created if missing)")
    p.add_argument("--target", default="host", choices=TARGET_NAMES,
                   help="host: this CPU (default); x86_64: any 64-bit x86 Linux; aarch64: 64-bit ARM Linux")
    p.add_argument("--slots", type=positive_int, default=1, help="streams stepped in one call (default 1)")
    p.set_defaults(func=run_cli)


def run_cli(args) -> int:
    """Export, print where; a bad setting or a part that cannot be exported: one line, exit 2."""
    from .learner import ConfigError
    from .program import ExportError
    from .write import export_learner
    try:
        m = export_learner(args.config, args.out, args.target, args.slots)
    except ConfigError as e:
        print("config error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except (ExportError, ValueError) as e:
        print("export error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    print(f"exported to {args.out} for {m['target']}: {', '.join(m['programs'])} programs over "
          f"{len(m['buffers'])} state buffers, float{m['precision']}, {m['slots']} slot(s); serve it with "
          f"streamtrace-runner serve {args.out}")
    return 0
