"""Checkpoint files: named arrays + a JSON header in one ``.npz``, written atomically (numpy only:
the learner, the engine and the jax-free runner of an exported learner write the same files).

No pickle: arrays are stored as plain ``.npy`` members (loaded with allow_pickle=False) and
the header (format version, model/algorithm signature, checksum) as UTF-8 JSON bytes. A file
is written to a temporary name in the same folder, fsynced, then renamed over the target, so
a crash mid-write never leaves a half-written checkpoint under the real name.
"""
from __future__ import annotations

import io
import json
import math
import os
import re
from pathlib import Path

import numpy as np

from . import npz
from .digest import sha256
from .lazy_log import LazyLogger

__all__ = ["CheckpointError", "write_checkpoint", "read_checkpoint", "checkpoint_bytes", "loads_checkpoint",
           "CheckpointDir", "position_extra", "position_of"]

FORMAT = "streamtrace-checkpoint"
VERSION = 1
_META = "__meta__"
# signature parts compared setting by setting; "optimizer" differences only warn (see below)
_DESCRIBED = ("model", "optimizer")

log = LazyLogger("streamtrace.checkpoint")


class CheckpointError(RuntimeError):
    """A checkpoint is unreadable, corrupted, or belongs to a different model."""


def _digest(arrays: dict) -> str:
    h = sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(name.encode())
        h.update(a.dtype.str.encode())
        h.update(repr(a.shape).encode())
        h.update(a.reshape(-1).view(np.uint8))    # its bytes, not a copy (a.tobytes())
    return h.hexdigest()


def checkpoint_bytes(arrays: dict, signature: dict, extra: dict | None = None) -> bytes:
    """A checkpoint's bytes (what ``write_checkpoint`` writes; the cluster stores them in NATS)."""
    if any(n == _META for n in arrays):
        raise ValueError(f"'{_META}' is reserved")
    header = {"format": FORMAT, "version": VERSION, "signature": signature,
              "sha256": _digest(arrays), "extra": extra or {}}
    buf = io.BytesIO()
    np.savez(buf, **{_META: np.frombuffer(json.dumps(header).encode(), np.uint8)}, **arrays)
    return buf.getvalue()


def write_checkpoint(path, arrays: dict, signature: dict, extra: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = checkpoint_bytes(arrays, signature, extra)
    import tempfile             # (here: a runner that never writes a checkpoint never imports it)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def read_checkpoint(path, expect_signature: dict | None = None) -> tuple[dict, dict]:
    """Returns (arrays, header). Raises CheckpointError naming what is wrong: any failure to
    read the file is one (zipfile, zlib, numpy and json raise many kinds on damaged bytes).
    With ``expect_signature``, a file of another model is refused; different optimizer
    settings are allowed, logged and listed in ``header["warnings"]``."""
    return _read(Path(path), path, expect_signature)


def loads_checkpoint(raw: bytes, name: str, expect_signature: dict | None = None) -> tuple[dict, dict]:
    """``read_checkpoint`` of bytes (``checkpoint_bytes``); ``name`` labels the errors."""
    return _read(io.BytesIO(raw), name, expect_signature)


def _members(source, path) -> dict:
    """{name: array} of the archive (``npz.read``, else ``numpy.load``: what it cannot read)."""
    got = npz.read(source)
    if got is not None:
        return got
    if hasattr(source, "seek"):
        source.seek(0)
    loaded = np.load(source, allow_pickle=False)
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise CheckpointError(f"{path}: not a streamtrace checkpoint (a bare .npy array, not an archive)")
    with loaded as z:
        return {n: z[n] for n in z.files}


def _read(source, path, expect_signature):
    try:
        arrays = _members(source, path)
        if _META not in arrays:
            raise CheckpointError(f"{path}: not a streamtrace checkpoint (no header)")
        header = json.loads(bytes(arrays.pop(_META)).decode())
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: not a streamtrace checkpoint (the header is not a JSON object)")
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - damaged bytes surface as many exception types
        raise CheckpointError(f"{path}: unreadable or truncated checkpoint ({type(e).__name__}: {e})") from e
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise CheckpointError(f"{path}: unsupported checkpoint format {header.get('format')!r} "
                              f"version {header.get('version')!r} (expected {FORMAT!r} v{VERSION})")
    try:
        same = _digest(arrays) == header.get("sha256")
    except Exception as e:  # noqa: BLE001 - e.g. an array member of an unhashable dtype
        raise CheckpointError(f"{path}: unreadable checkpoint contents ({type(e).__name__}: {e})") from e
    if not same:
        raise CheckpointError(f"{path}: checksum mismatch, the file is corrupted")
    if not isinstance(header.get("signature", {}), dict):
        raise CheckpointError(f"{path}: not a streamtrace checkpoint (malformed signature)")
    if expect_signature is not None:
        check_signature(path, expect_signature, header, arrays)
    return arrays, header


def check_signature(path, want: dict, header: dict, arrays: dict | None = None):
    """Refuses (CheckpointError) a checkpoint of another model or learner. Optimizer settings
    that differ (learning rate, clipping, betas) are accepted with a logged warning: the saved
    optimizer state fits whenever the state signature matches, and changing the learning rate
    across a restart is a legitimate choice; a change that alters the optimizer *state*
    (Adam -> SGD, clipping on/off) is refused through the state signature."""
    got = header.get("signature", {})
    if "state_dict" in want and arrays is not None:
        # the arrays in the file against the ones the learner loads: how either side stores
        # its state (e.g. a checkpoint written before big weights got arrays of their own) is
        # then no reason to refuse it
        want = {k: v for k, v in want.items() if k != "state"}
        got = {**{k: v for k, v in got.items() if k not in ("state", "state_dict")},
               "state_dict": [[n, list(a.shape), a.dtype.str] for n, a in arrays.items()]}
    diffs = signature_diff(want, got)
    opt = optimizer_diff(want, got)
    if diffs:
        raise CheckpointError(f"{path}: checkpoint is from a different model/learner: "
                              + "; ".join(diffs + opt))
    if opt:
        msg = f"{path}: restoring with different optimizer settings: " + "; ".join(opt)
        log.warning(msg)
        header.setdefault("warnings", []).append(msg)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def description_diff(want: dict, got: dict, where: str) -> list[str]:
    """One line per setting (``learner.describe``) that differs, named ``<where>.<key>``."""
    diffs = []
    for k in sorted(set(want) | set(got)):
        a, b = want.get(k, "<absent>"), got.get(k, "<absent>")
        if not _same(a, b):
            diffs.append(f"{where}.{k}: expected {a!r}, checkpoint has {b!r}")
    return diffs


def optimizer_diff(want: dict, got: dict) -> list[str]:
    if "optimizer" not in want or "optimizer" not in got:   # older checkpoints do not record it
        return []
    return description_diff(want["optimizer"], got["optimizer"], "optimizer")


def signature_diff(want: dict, got: dict, limit: int = 6) -> list[str]:
    diffs = []
    for k in sorted(set(want) | set(got)):
        if k in ("state", "state_dict") or k in _DESCRIBED:
            continue
        if isinstance(want.get(k), dict) and isinstance(got.get(k), dict):     # a section: setting by setting
            diffs += description_diff(want[k], got[k], k)
        elif want.get(k) != got.get(k):
            diffs.append(f"{k}: expected {want.get(k)!r}, checkpoint has {got.get(k)!r}")
    if "model" in want and "model" in got:     # older checkpoints do not record it
        diffs += description_diff(want["model"], got["model"], "model")
    key = "state_dict" if "state_dict" in want else "state"
    ws = {n: (list(s), d) for n, s, d in want.get(key, [])}
    gs = {n: (list(s), d) for n, s, d in got.get(key, [])}
    for n in sorted(set(ws) - set(gs)):
        diffs.append(f"state '{n}' missing from the checkpoint")
    for n in sorted(set(gs) - set(ws)):
        diffs.append(f"checkpoint has unexpected state '{n}'")
    for n in sorted(set(ws) & set(gs)):
        if ws[n] != gs[n]:
            diffs.append(f"state '{n}': expected shape/dtype {ws[n]}, checkpoint has {gs[n]}")
    if len(diffs) > limit:
        diffs = diffs[:limit] + [f"... and {len(diffs) - limit} more"]
    return diffs


def signature_without(signature: dict, is_part, lists=("state", "state_dict", "slot_state")) -> dict:
    """``signature`` without one part of the state: the keys ``is_part`` accepts, and the entries
    of its ``lists`` (each ``[name, shape, dtype]``) whose name it accepts.

    Parameters
    ----------
    signature : a learner's or a partition's signature (``check_signature`` compares them).
    is_part : name -> bool, for a top-level key and for a state entry's name.
    lists : the keys that hold state entries.

    >>> sig = {"model": "gru", "combine": {"eta": 1}, "state": [["hidden.h", [4], "<f4"], ["combine.L", [3], "<f8"]]}
    >>> signature_without(sig, lambda n: n.split(".")[0] == "combine")
    {'model': 'gru', 'state': [['hidden.h', [4], '<f4']]}
    """
    out = {k: v for k, v in signature.items() if not is_part(k)}
    for key in lists:
        if isinstance(out.get(key), list):
            out[key] = [entry for entry in out[key] if not is_part(entry[0])]
    return out


def position_extra(steps: int, version: int, streams: dict) -> dict:
    """The ``extra`` an engine's checkpoint (``serve``'s or the runner's) holds beside the state:
    its step count, weights version and each stream's position (``StreamTable.positions``).

    >>> position_of({"extra": position_extra(12, 3, {"a": [0, 5]})})
    (12, 3, {'a': [0, 5]})
    """
    return {"steps": steps, "version": version, "streams": streams}


def position_of(header: dict) -> tuple[int, int, dict]:
    """(steps, version, stream positions) of a checkpoint ``header`` written with
    ``position_extra`` (0, 0, {} for what it does not hold)."""
    extra = header.get("extra", {})
    return int(extra.get("steps", 0)), int(extra.get("version", 0)), extra.get("streams", {})


class CheckpointDir:
    """Numbered checkpoints ``ckpt-<step>.npz`` in one folder, keeping the newest ``keep``."""

    PATTERN = re.compile(r"^ckpt-(\d+)\.npz$")

    def __init__(self, folder, keep: int = 3):
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.folder, self.keep = Path(folder), keep

    def paths(self) -> list[Path]:
        if not self.folder.exists():
            return []
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := self.PATTERN.match(p.name))]
        return [p for _, p in sorted(found)]

    def save(self, step: int, arrays: dict, signature: dict, extra: dict | None = None) -> Path:
        for tmp in self.folder.glob(".ckpt-*.npz.*.tmp") if self.folder.exists() else ():
            tmp.unlink(missing_ok=True)   # left by a writer that was killed mid-write
        path = write_checkpoint(self.folder / f"ckpt-{step:012d}.npz", arrays, signature, extra)
        others = [p for p in self.paths() if p != path]
        # files numbered at or after this step are stale (left by an earlier run): this state
        # supersedes them; then keep the newest `keep` including the one just written
        stale = [p for p in others if int(self.PATTERN.match(p.name).group(1)) >= step]
        older = [p for p in others if p not in stale]
        for old in stale + older[:max(0, len(older) - (self.keep - 1))]:
            old.unlink(missing_ok=True)
        return path

    def latest_good(self, expect_signature: dict | None = None):
        """(path, arrays, header, errors) of the newest readable checkpoint, or Nones; errors
        name the newer unreadable ones, each also logged as it is skipped. A checkpoint of
        another model is not skipped: it raises (its folder belongs to something else)."""
        errors = []
        for path in reversed(self.paths()):
            try:
                arrays, header = read_checkpoint(path)
            except CheckpointError as e:
                log.warning("skipping checkpoint, trying an older one: %s", e)
                errors.append(str(e))
                continue
            if expect_signature is not None:
                check_signature(path, expect_signature, header, arrays)
            return path, arrays, header, errors
        return None, None, None, errors
