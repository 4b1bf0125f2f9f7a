"""The lsl bridge (`streamtrace bridge lsl`): being built; see issue 10."""
from __future__ import annotations


def add_arguments(parser):
    """Flags of `streamtrace bridge lsl` beyond --config and --endpoint."""


def run_cli(args) -> int:
    raise SystemExit("streamtrace bridge lsl: not available yet")
