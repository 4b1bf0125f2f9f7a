"""The mqtt bridge (`streamtrace bridge mqtt`): being built; see issue 10."""
from __future__ import annotations


def add_arguments(parser):
    """Flags of `streamtrace bridge mqtt` beyond --config and --endpoint."""


def run_cli(args) -> int:
    raise SystemExit("streamtrace bridge mqtt: not available yet")
