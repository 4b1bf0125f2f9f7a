"""``streamtrace export``: a learner's folder for the jax-free runner (runner.py).

The folder: ``step.vmfb`` (the IREE module of the one-slot step program, program.py),
``state.npz`` (the initial state, in the checkpoint format the learner and ``serve`` write),
``state_map.npz`` (where each of its arrays lives in the program's buffers, state_map.py) and
``manifest.json`` (the program's inputs and outputs, the config's learner sections, the
target, the library versions and the files' sha256).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import math
from pathlib import Path

import numpy as np

from ..checkpoints import write_checkpoint
from .learner import learner_of, load_config
from .program import ExportError, compile_program, step_program
from streamtrace_runner.runtime import FILES, FORMAT
from streamtrace_runner.state_map import SHIFT, StateMap
from .targets import TARGETS

__all__ = ["export_learner", "FORMAT", "FILES"]

# the config sections that describe the learner (the manifest keeps these; sockets, security
# and bridge sections may name key files or hold passwords and are left out)
LEARNER_SECTIONS = ("model", "reservoir", "transform", "readout", "learning", "learned", "combine", "metrics")
_LIBRARIES = ("streamtrace", "jax", "jaxlib", "brainstate", "numpy", "iree-base-compiler")


def _versions() -> dict:
    out = {}
    for name in _LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def state_positions(learner) -> dict:
    """{checkpoint name: int64 positions} (state_map.py) made by the learner's own buffers ->
    checkpoint code run on buffers holding their own positions."""
    index = [np.arange(math.prod(a.shape), dtype=np.int64).reshape(a.shape) + (b << SHIFT)
             for b, a in enumerate(learner.programs.avals)]
    return learner.names.expand(learner.layout.to_named(index))   # what state_dict() does to the buffers


def _outputs(learner) -> dict:
    """How the step's output vector splits (as ``Programs._decode``)."""
    one = learner.out_shape if learner.horizon == 1 else (learner.horizon,) + learner.out_shape
    pred = one if learner.slots is None else (learner.n,) + one
    return {"prediction": list(pred), "loss": learner.n, "per_slot_applied": bool(learner.per_slot),
            "events": list(learner.programs.events)}


def _weights(learner) -> dict:
    """What a weights message carries, as checkpoint names: {"params": {params name: name},
    "state": {predictor_state name: name}} (the runner's server sends them as ``serve`` does)."""
    names = list(learner.state_dict())
    params = {n: next(k for k in names if k.startswith("params.") and k.endswith("." + n)) for n in learner.params}
    return {"params": params, "state": {n: n for n in learner.predictor_state() if n in names}}


def _check_exportable(cfg):
    if cfg.learning.label_delay:
        raise ExportError("learning.label_delay: delayed labels are not exported (the label program is not "
                          "part of the export yet); export without label_delay")


def _sha256(folder: Path) -> dict:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in FILES}


def export_learner(config, out, target: str = "host", slots: int = 1) -> dict:
    """Export the learner of the TOML ``config`` (None: the default learner) over ``slots``
    slots to the folder ``out`` for ``target`` (targets.py); returns the manifest. Raises
    ``ConfigError`` (a bad setting) or ``ExportError`` (a part that cannot be exported).

    >>> import tempfile
    >>> manifest = export_learner(None, tempfile.mkdtemp(), "x86_64")
    >>> manifest["target"], manifest["outputs"]["prediction"]
    ('x86_64', [1, 1])
    """
    if target not in TARGETS:
        raise ExportError(f"--target {target!r}: one of {', '.join(TARGETS)}")
    if slots < 1:
        raise ExportError(f"--slots {slots}: at least 1")
    cfg = load_config(config)
    _check_exportable(cfg)
    learner = learner_of(cfg, slots)
    text, ins, outs, tanh = step_program(learner)
    vmfb = compile_program(text, target)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "step.vmfb").write_bytes(vmfb)
    write_checkpoint(folder / "state.npz", learner.state_dict(), learner.signature(), {"step": 0})
    buffers = [[list(a.shape), np.dtype(a.dtype).str] for a in learner.programs.avals]
    StateMap(state_positions(learner), buffers).save(folder)
    arg = lambda a: [list(a.shape), np.dtype(a.dtype).str]
    manifest = {
        "format": FORMAT, "version": 1, "target": target, "triple": TARGETS[target][0],
        "function": "main", "buffers": buffers, "inputs": {k: arg(a) for k, a in zip(
            ("x", "y", "active", "learn"), ins[len(buffers):])},
        "output": arg(outs[-1]), "outputs": _outputs(learner), "weights": _weights(learner),
        "fixed_from": int(learner.layout.fixed_from), "slots": learner.n,
        "precision": cfg.model.precision, "tanh64_rewritten": tanh, "signature": learner.signature(),
        "config": {k: dataclasses.asdict(getattr(cfg, k)) for k in LEARNER_SECTIONS},
        "versions": _versions(), "sha256": _sha256(folder)}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    return manifest
