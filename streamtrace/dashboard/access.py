"""Where the dashboard may listen and how it reaches the engine: no web imports here, so
``serve --dashboard`` can refuse a bad option before anything starts."""
from __future__ import annotations

from ..addresses import is_loopback

__all__ = ["DashboardError", "check_exposure", "connect_address", "is_loopback"]


class DashboardError(ValueError):
    """A dashboard option that cannot be honoured; the message names the option."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option


def check_exposure(host: str, token: str | None, allow_anonymous: bool, announce=print):
    """Refuse a non-loopback bind without a token, unless allow_anonymous (then say so loudly)."""
    if is_loopback(host) or token:
        return
    if not allow_anonymous:
        raise DashboardError("--token", f"the dashboard would listen on {host!r}, beyond loopback, without a "
                             "token; give --token SECRET (or STREAMTRACE_DASHBOARD_TOKEN), or --allow-anonymous "
                             "to let anyone who can reach it read every stream")
    announce(f"WARNING: *** the dashboard listens on {host!r} WITHOUT A TOKEN (allow_anonymous): anyone who "
             "can reach this address can read every stream's signal and predictions ***")


def connect_address(bind: str) -> str:
    """tcp://0.0.0.0:5557 or tcp://*:5557 (every interface) -> tcp://127.0.0.1:5557; others as they are."""
    for anywhere in ("tcp://0.0.0.0:", "tcp://*:"):
        if bind.startswith(anywhere):
            return "tcp://127.0.0.1:" + bind[len(anywhere):]
    if bind.startswith("tcp://[::]:"):
        return "tcp://[::1]:" + bind[len("tcp://[::]:"):]
    return bind
