"""jax's persistent compilation cache, pointed at a user cache folder.

A restarted engine then loads its compiled step programs from disk instead of running XLA
again (the AOT ``jit(...).lower().compile()`` the learner uses goes through the same cache).
jax's defaults skip programs that compile in under a second or are small; ours are both, so
every program is cached. The folder is trusted code: never share it with untrusted users.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEFAULT_DIR", "enable", "disable", "resolve", "entries"]

DEFAULT_DIR = "~/.cache/streamtrace/jax"


def resolve(path: str) -> Path | None:
    """The folder a config value names ("" : no cache); ``~`` and $VARS expanded."""
    if not path:
        return None
    return Path(os.path.expandvars(os.path.expanduser(path)))


def enable(path: str | os.PathLike) -> Path:
    """Cache every compiled program of this process in ``path`` (created if missing)."""
    import jax
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if jax.config.jax_compilation_cache_dir != str(folder):
        jax.config.update("jax_compilation_cache_dir", str(folder))
        _reopen()   # jax opens its cache once per process: re-open it at the new folder
    return folder


def disable():
    """No persistent cache for what this process compiles next."""
    import jax
    jax.config.update("jax_enable_compilation_cache", False)   # no cache keys computed either
    if jax.config.jax_compilation_cache_dir is not None:
        jax.config.update("jax_compilation_cache_dir", None)
        _reopen()


def _reopen():
    # jax opens the cache folder on its first compile and keeps it; its public API has no
    # way to re-open it, so use the (stable since 0.4) private reset
    from jax._src import compilation_cache as cc
    cc.reset_cache()


def entries(path: str | os.PathLike) -> list[Path]:
    """The cached programs in ``path`` (jax names them ``<key>-cache``)."""
    folder = Path(path)
    return sorted(folder.glob("*-cache")) if folder.is_dir() else []
