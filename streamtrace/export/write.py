"""``streamtrace export``: a learner's folder for the jax-free runner (runner.py).

The folder: ``step.vmfb`` (the IREE module of the step program, program.py; beside it
``predict.vmfb``, its prediction twin, ``label.vmfb`` with ``learning.label_delay``, and
``reset.vmfb`` over several slots),
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

from ..checkpoints import read_checkpoint, write_checkpoint
from ..learner.step import COUNTERS
from .learner import learner_of, load_config
from .program import ExportError, compile_program, programs_of
from streamtrace_runner.runtime import FILES, FORMAT
from streamtrace_runner.state_map import SHIFT, StateMap
from .targets import TARGETS

__all__ = ["export_learner", "FORMAT", "FILES"]

# the config sections that describe the learner (the manifest keeps these; sockets, security
# and bridge sections may name key files or hold passwords and are left out)
LEARNER_SECTIONS = ("stream", "model", "reservoir", "transform", "readout", "learning", "learned", "combine", "screen", "metrics")
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


def _seasons(learner):
    """Where the runner reads the seasons its experts use (``Experts.season_columns`` of the
    ``combine.aux.int`` array), or None: a learner without a seasonal experts' mixture."""
    combine = learner.fns.combine
    if combine is None or not hasattr(combine, "season_columns"):
        return None
    return combine.season_columns(math.prod(learner.out_shape), learner.y_dtype)


def _sha256(folder: Path, modules: list) -> dict:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in dict.fromkeys(FILES + tuple(modules))}


def _arg(a) -> list:
    return [list(a.shape), np.dtype(a.dtype).str]


def _signature(program, n_buffers: int) -> dict:
    """A program's inputs and outputs past the state buffers (step, predict and reset take the
    buffers first; step, label and reset return them first)."""
    returns = program.name != "predict"
    return {"inputs": [_arg(a) for a in program.ins[n_buffers:]],
            "outputs": [_arg(a) for a in program.outs[n_buffers if returns else 0:]]}


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
    learner = learner_of(cfg, slots)
    programs = programs_of(learner)
    compiled = {p.name: compile_program(p.text, target, p.name) for p in programs}
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, vmfb in compiled.items():
        (folder / f"{name}.vmfb").write_bytes(vmfb)
    write_checkpoint(folder / "state.npz", learner.state_dict(), learner.signature(), {"step": 0})
    buffers = [[list(a.shape), np.dtype(a.dtype).str] for a in learner.programs.avals]
    StateMap(state_positions(learner), buffers).save(folder)
    step = programs[0]
    manifest = {
        "format": FORMAT, "version": 1, "target": target, "triple": TARGETS[target][0],
        "function": "main", "buffers": buffers, "inputs": {k: _arg(a) for k, a in zip(
            ("x", "y", "active", "learn"), step.ins[len(buffers):])},
        "output": _arg(step.outs[-1]), "outputs": _outputs(learner), "weights": _weights(learner),
        "programs": {p.name: _signature(p, len(buffers)) for p in programs},
        "label_delay": int(learner.label_delay), "counters": list(COUNTERS), "seasons": _seasons(learner), "fixed_from": int(learner.layout.fixed_from),
        "slots": learner.n, "precision": cfg.model.precision, "tanh64_rewritten": sum(p.tanh for p in programs),
        "signature": learner.signature(),
        "config": {k: dataclasses.asdict(getattr(cfg, k)) for k in LEARNER_SECTIONS},
        "versions": _versions(), "sha256": _sha256(folder, [f"{n}.vmfb" for n in compiled]),
        "state_sha256": read_checkpoint(folder / "state.npz")[1]["sha256"]}     # its arrays' digest
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    return manifest
