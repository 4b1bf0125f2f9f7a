"""A live, read-only web dashboard fed by the engine's PUB socket (``streamtrace dashboard``).

Needs the optional extra ``streamtrace[dashboard]`` (starlette, uvicorn); uPlot is shipped in
``static/`` with its licence, so nothing is fetched at run time.
"""
from __future__ import annotations

__all__ = ["Feed", "make_app", "run"]


def __getattr__(name):      # the web server's imports only when asked for
    if name == "Feed":
        from .feed import Feed
        return Feed
    if name in ("make_app", "run"):
        from . import server
        return getattr(server, name)
    raise AttributeError(name)
