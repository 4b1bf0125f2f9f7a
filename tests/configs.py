"""One way to write a serve config in the tests: ``serve_config(sock_dir, **sections)`` gives the
TOML tables (``{section: {key: value}}``, what ``write_config`` and ``load_config(None, ...)``
take), with the engine's sockets as ipc:// endpoints in ``sock_dir``.

>>> serve_config("/tmp/s", engine={"slots": 2})
{'engine': {'slots': 2}, 'sockets': {'router': 'ipc:///tmp/s/router', 'pull': '', 'pub': ''}}
>>> serve_config("/tmp/s", pull=True, pub=True)["sockets"]["pub"]
'ipc:///tmp/s/pub'
"""
from __future__ import annotations

import copy

__all__ = ["serve_config", "ipc_sockets", "GRU_SMALL"]

# a small named model: fast to compile, no default learner
GRU_SMALL = {"model": {"stack": "gru", "n_hidden": 16}}


def ipc_sockets(sock_dir, *, pull: bool = False, pub: bool = False) -> dict:
    """``[sockets]``: the router always, PULL and PUB when asked ("" turns them off)."""
    at = lambda k: f"ipc://{sock_dir}/{k}"      # noqa: E731
    return {"router": at("router"), "pull": at("pull") if pull else "", "pub": at("pub") if pub else ""}


def serve_config(sock_dir=None, *, pull: bool = False, pub: bool = False, **sections) -> dict:
    """A copy of ``sections`` (each a table) with ``[sockets]`` in ``sock_dir`` (None: left as
    given); a ``sockets`` table in ``sections`` wins key by key."""
    out = copy.deepcopy(sections)
    if sock_dir is not None:
        out["sockets"] = {**ipc_sockets(sock_dir, pull=pull, pub=pub), **out.get("sockets", {})}
    return out
