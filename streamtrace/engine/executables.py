"""Compiled step programs kept on disk, so that a restarted engine skips tracing them.

jax's persistent compilation cache (compile_cache.py) skips XLA, but it is keyed by the
lowered program, so a restart still traces the learner's step and lowers it before it can
look: about half a second for GRU-256 (docs/benchmarks.md, cold start). Here a program is
stored as the serialized executable itself, keyed by what determines it before any tracing:
the config's learner sections, the program's name (``("loop", 8)``, ...), this package's
source, the library versions and the machine. A model from ``model.factory`` (user code this
key cannot see) is never stored. Like jax's cache, the folder is trusted code: loading an
executable runs it.

An executable jax loaded from its own cache serializes without its kernels (loaded again,
its first call fails with "Function ... not found"; jax 0.10 and 0.12). So a program is
stored only once a copy of it, loaded back, has run (on zeros), and one that fails so is
compiled again under an option jax's cache cannot have seen (a collective timeout: these
programs have no collectives), which XLA compiles afresh.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import pickle
import platform
import time
from importlib import metadata
from pathlib import Path

from .config import EngineConfig

__all__ = ["ExecutableStore", "fingerprint"]

log = logging.getLogger("streamtrace.engine")

KEEP = 200     # the newest stored programs kept in a folder; older ones are removed on save
_MISS = "xla_cpu_collective_timeout_seconds"    # changes a program's key in jax's cache, not its code
# every section that is compiled into a program (constants, shapes, which code runs); the
# others (sockets, publish, checkpoint, security, bridge) never reach the learner
_SECTIONS = ("model", "reservoir", "transform", "readout", "learning", "learned", "combine", "metrics", "engine")
_PACKAGES = ("jax", "jaxlib", "brainstate", "brainunit", "saiunit", "optax", "numpy")


@functools.cache
def _source_digest() -> str:
    """This package's Python source, hashed once per process."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _machine() -> str:
    """What an executable was compiled for: XLA targets the host CPU's instruction set."""
    import jax
    dev = jax.devices()[0]
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()}|{dev.platform}|{dev.device_kind}|{dev.client.platform_version}|{flags}"


def _versions() -> str:
    out = []
    for p in _PACKAGES:
        try:
            out.append(f"{p}={metadata.version(p)}")
        except metadata.PackageNotFoundError:
            out.append(f"{p}=-")
    return ",".join(out)


def _runs(blob: bytes):
    """Load the stored bytes as a program and run it once on zeros (raises if it cannot)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.serialize_executable import deserialize_and_load
    program = deserialize_and_load(*pickle.loads(blob))
    args, kwargs = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), program.args_info)
    jax.block_until_ready(program(*args, **kwargs))


def fingerprint(cfg: EngineConfig) -> str | None:
    """What the programs of ``cfg``'s learner depend on, hashed; None when something they
    depend on cannot be seen from here (a user's model factory)."""
    if cfg.model.factory:
        return None
    import jax
    parts = [repr(dataclasses.asdict(getattr(cfg, s))) for s in _SECTIONS]
    parts += [_source_digest(), _versions(), _machine(), repr(jax.config.jax_enable_x64),
              repr(jax.config.jax_default_matmul_precision)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class ExecutableStore:
    """Serialized executables of one learner in ``folder``, under ``fingerprint`` + a program
    name. ``load`` and ``save`` never raise for the store's own trouble (a file that cannot be
    read or written costs a compile, not service)."""

    def __init__(self, folder: str | os.PathLike, fingerprint: str):
        self.folder, self.fingerprint = Path(folder), fingerprint
        self.loaded = self.saved = 0

    @classmethod
    def for_config(cls, folder, cfg: EngineConfig) -> ExecutableStore | None:
        fp = fingerprint(cfg)
        return None if folder is None or fp is None else cls(Path(folder) / "executables", fp)

    def _path(self, name) -> Path:
        key = hashlib.sha256(f"{self.fingerprint}|{name!r}".encode()).hexdigest()
        return self.folder / f"{key}.xla"

    def compile(self, name, lower, options):
        """The program stored as ``name``, or ``lower()`` compiled with ``options`` and stored
        (see the module's note for when it is compiled twice)."""
        got = self.load(name)
        if got is not None:
            return got
        compiled = lower().compile(options)
        if not self.save(name, compiled):
            fresh = lower().compile({**options, _MISS: 10 ** 6 + time.time_ns() % 10 ** 9})
            if self.save(name, fresh):
                return fresh
        return compiled

    def load(self, name):
        """The program stored as ``name``, or None."""
        path = self._path(name)
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        try:
            from jax.experimental.serialize_executable import deserialize_and_load
            payload, in_tree, out_tree = pickle.loads(blob)
            compiled = deserialize_and_load(payload, in_tree, out_tree)
        except Exception as e:  # noqa: BLE001 - a damaged or foreign entry: compile instead
            log.warning("compiled program %s could not be loaded (%s: %s); compiling it", path.name,
                        type(e).__name__, e)
            path.unlink(missing_ok=True)
            return None
        self.loaded += 1
        try:
            os.utime(path)      # recently used: kept by _prune
        except OSError:
            pass
        return compiled

    def save(self, name, compiled) -> bool:
        """Store ``compiled`` as ``name`` (written whole or not at all) if a copy loaded back
        from its bytes runs; whether it was stored."""
        try:
            from jax.experimental.serialize_executable import serialize
            blob = pickle.dumps(serialize(compiled))
            _runs(blob)
        except Exception as e:  # noqa: BLE001 - a program that does not come back stays unstored
            log.debug("compiled program %r not stored: %s", name, e)
            return False
        path = self._path(name)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except OSError as e:
            log.warning("compiled program not stored in %s: %s", self.folder, e)
            tmp.unlink(missing_ok=True)
            return True       # it would have come back: storing it, not the program, failed
        self.saved += 1
        self._prune()
        return True

    def _prune(self):
        try:
            files = sorted(self.folder.glob("*.xla"), key=lambda p: p.stat().st_mtime)
            for old in files[:-KEEP]:
                old.unlink(missing_ok=True)
        except OSError:
            pass
