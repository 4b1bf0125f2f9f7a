"""The jax-free runner of an exported learner (``streamtrace export``): numpy and IREE's runtime.

``Runner(folder)`` loads the folder's IREE module and its state, steps it with the state kept
in the runtime's buffers (only the inputs and the step's output vector cross to the host), and
reads or writes the state as a checkpoint in the format the learner and ``serve`` use. This
module imports numpy, ``iree.runtime`` and the checkpoint format, never jax.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .checkpoints import read_checkpoint, write_checkpoint
from .digest import file_sha256
from .heap import keep_freed, trim
from .state_map import StateMap

__all__ = ["Runner", "RunnerError"]

FORMAT = "streamtrace-export"
FILES = ("step.vmfb", "state.npz", StateMap.FILE)     # an export folder's files, by the manifest's sha256
# with, where exported: predict.vmfb, label.vmfb (learning.label_delay), reset.vmfb (several slots)
LABEL_CODES = {1: "unknown_label", 2: "label_too_late", 3: "already_labelled", 4: "not_finite"}


class RunnerError(RuntimeError):
    """An export folder that cannot be run (missing, damaged, another format) or bad input."""


def read_manifest(folder: Path) -> dict:
    """The folder's manifest, its state map and step module checked against their sha256 (the
    other modules when first loaded: ``check_file``; the initial state by its own digest, as
    a checkpoint, when read)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise RunnerError(f"{folder}: not an exported learner ({type(e).__name__}: {e})") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != 1:
        raise RunnerError(f"{folder}: unsupported export format {manifest.get('format')!r} "
                          f"version {manifest.get('version')!r}")
    for name in FILES:
        if name != "state.npz" or "state_sha256" not in manifest:
            check_file(folder, manifest, name)
    return manifest


def check_file(folder: Path, manifest: dict, name: str):
    """``RunnerError`` unless the folder's file ``name`` has the manifest's sha256."""
    try:
        digest = file_sha256(folder / name)
    except OSError as e:
        raise RunnerError(f"{folder}: {name} unreadable ({e.strerror})") from None
    if digest != manifest["sha256"].get(name):
        raise RunnerError(f"{folder}: {name} does not match the manifest's sha256 (damaged or replaced)")


class Runner:
    """Steps an exported learner folder; ``state``: a checkpoint to start from (default the
    folder's initial ``state.npz``); ``driver``: IREE's ``local-sync`` (one thread, the
    fewest hops per call) or ``local-task``.

    >>> import tempfile, numpy as np
    >>> from streamtrace.export.write import export_learner     # (where streamtrace is installed)
    >>> folder = tempfile.mkdtemp(); _ = export_learner(None, folder)
    >>> runner = Runner(folder)
    >>> prediction, loss, applied = runner.step(np.array([[0.5]]))
    >>> prediction.shape, runner.steps
    ((1, 1), 1)
    """

    def __init__(self, folder, state=None, driver: str = "local-sync"):
        from .iree_calls import Device
        self.folder = Path(folder)
        self.manifest = m = read_manifest(self.folder)
        self.map = StateMap.load(self.folder, m["buffers"])
        keep_freed()        # each step's blocks reused by the next (heap.py)
        self.device = Device(driver)
        self._programs = {}
        self._fn = self.program("step")
        self._in = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in m["inputs"].items()}
        if "label" in m.get("programs", {}):
            self._in["label"] = tuple(m["programs"]["label"]["inputs"][2][0]), np.dtype(m["programs"]["label"]["inputs"][2][1])
        self._fixed = m.get("fixed_from", len(m["buffers"]))
        self._sizes = {k: int(np.prod(shape)) for k, (shape, _) in self._in.items()}
        # inputs most steps pass as they are, copied to the device once, not at every step
        self._constant = {"y": self.device.buffer(np.zeros(*self._in["y"])),
                          **{(k, v): self.device.buffer(np.full(self._in[k][0], v, self._in[k][1])) for k in ("active", "learn")
                             for v in (True, False)}}
        out = m["outputs"]
        self._pred_shape, self._n = tuple(out["prediction"]), out["loss"]
        self._per_slot = out["per_slot_applied"]
        self._event_names = [{"screen": "outlier", "rollback": "rolled_back"}[k] for k in out.get("events", [])]
        n_pred, n = int(np.prod(self._pred_shape)), self._n
        end = n_pred + n + (n if self._per_slot else 1)      # the output vector: prediction, loss, applied, events
        self._layout = slice(0, n_pred), slice(n_pred, n_pred + n), slice(n_pred + n, end), slice(end, None)
        (length,), dtype = m["output"]
        self._vector = np.dtype(dtype), int(length)
        # per slot, of the last step: the screen found an outlier, the step was undone
        self.events = {"outlier": np.zeros(self._n, bool), "rolled_back": np.zeros(self._n, bool)}
        # the same, of the last ``predict`` (the twin's: its screen's verdict; nothing rolled back)
        self.twin_events = {k: v.copy() for k, v in self.events.items()}
        self.steps = 0
        self._frozen = None         # the initial state's frozen weights on the device, shared (never written)
        self.load(self.folder / "state.npz" if state is None else state)

    def program(self, name: str):
        """The exported program ``name`` (step, predict, label, reset), its module loaded on
        first use (a program the server never runs costs no memory); ``RunnerError`` if the
        folder has none of that name."""
        fn = self._programs.get(name)
        if fn is None:
            if name != "step" and name not in self.manifest.get("programs", {}):
                raise RunnerError(f"{self.folder}: no {name} program in this export")
            if name != "step":       # (the step's was checked with the manifest)
                check_file(self.folder, self.manifest, f"{name}.vmfb")
            from .iree_calls import Program
            fn = self._programs[name] = Program(self.device, self.folder / f"{name}.vmfb", self.manifest["function"])
        return fn

    def load(self, path):
        """Continue from the checkpoint ``path`` (refused, ``CheckpointError``, if it is of
        another learner or damaged); its ``extra["step"]`` becomes ``steps``."""
        arrays, header = read_checkpoint(path, expect_signature=self.manifest["signature"])
        initial = Path(path) == self.folder / "state.npz"
        if initial and "state_sha256" in self.manifest and header.get("sha256") != self.manifest["state_sha256"]:
            raise RunnerError(f"{self.folder}: state.npz does not match the manifest's sha256 (damaged or replaced)")
        host = self.map.buffers(arrays)
        del arrays           # (the host copies go one by one as they reach the device: a lower peak)
        self._buffers = self._to_device(host)
        if initial and self._frozen is None:
            self._frozen = self._buffers[self._fixed:]
        self.steps = int(header.get("extra", {}).get("step", 0))
        trim()

    def initial_buffers(self) -> list:
        """Device buffers of the folder's initial state (``state.npz``, read again); its frozen
        weights' buffers (from the manifest's ``fixed_from`` on) read once and shared by every
        state made here (no program writes them)."""
        arrays, _ = read_checkpoint(self.folder / "state.npz", expect_signature=self.manifest["signature"])
        host = self.map.buffers(arrays, None if self._frozen is None else self._fixed)
        del arrays
        out = self._to_device(host)
        if self._frozen is None:
            self._frozen = out[self._fixed:]
        trim()
        return out[:self._fixed] + self._frozen

    @property
    def buffers(self) -> list:
        """The state, as the program's device buffers (set it to step another state: bank.py)."""
        return self._buffers

    @buffers.setter
    def buffers(self, value: list):
        self._buffers = value

    def device_buffers(self, named: dict) -> list:
        """Device buffers holding the checkpoint arrays ``named`` (``StateMap.buffers``)."""
        return self._to_device(self.map.buffers(named))

    def _to_device(self, host: list) -> list:
        out = []
        host.reverse()
        while host:
            out.append(self.device.buffer(host.pop()))
        return out

    def host(self, buffers, only=None) -> list:
        """Numpy copies of device buffers; ``only``: of those positions alone (None elsewhere)."""
        return [self.device.host(b) if only is None or i in only else None for i, b in enumerate(buffers)]

    def _input(self, name, value):
        shape, dtype = self._in[name]
        a = np.asarray(value, dtype)
        if a.size != self._sizes[name]:
            raise RunnerError(f"{name} has shape {a.shape}, expected {shape}")
        return a.reshape(shape)

    def _flags(self, name, value):
        """``value`` of a flag input (active, learn) for the program: None or a bool is every
        slot's (the buffers of all ones and all zeros made once), else an array per slot."""
        if value is None or isinstance(value, bool):
            return self._constant[(name, value is not False)]
        a = self._input(name, value)
        if a.all():
            return self._constant[(name, True)]
        return a if a.any() else self._constant[(name, False)]

    def step(self, x, y=None, active=None, learn=None):
        """One step of every slot: (prediction, loss per slot, applied), as the learner's
        ``StepResult`` fields. ``y``: the target (supervised; ignored in forecast mode);
        ``active``, ``learn``: per slot, or one bool for all (None: True)."""
        y = self._constant["y"] if y is None else self._input("y", y)
        active, learn = self._flags("active", active), self._flags("learn", learn)
        *out, vec = self._fn(*self._buffers, self._input("x", x), y, active, learn)
        self._kept(out)
        self.steps += 1
        return self.decode(self.device.read(vec, *self._vector))

    def _kept(self, out):
        # the frozen weights' buffers (from ``fixed_from`` on) never change: the ones passed in
        # are kept, whatever a program hands back, so the slots of a bank go on sharing one copy
        self._buffers = out[:self._fixed] + self._buffers[self._fixed:]

    def predict(self, x, y=None, active=None, learn=None):
        """The step's (prediction, loss, applied (False)) without the step: the prediction twin
        (``Programs.predict``), the state untouched; ``step``'s prediction within float rounding
        (a module compiled apart); its per-slot events in ``twin_events``."""
        y = self._constant["y"] if y is None else self._input("y", y)
        active, learn = self._flags("active", active), self._flags("learn", learn)
        [vec] = self.program("predict")(*self._buffers, self._input("x", x), y, active, learn)
        return self.decode(self.device.read(vec, *self._vector), events=self.twin_events)

    def label(self, y, age: int, slot: int = 0):
        """Apply the label ``y`` of the step ``age`` steps before ``slot``'s latest (learning.
        label_delay; ``Programs.label``): (status, loss, applied); status 0: applied, else a code
        of ``LABEL_CODES`` and the state unchanged."""
        out = self.program("label")(*self._buffers, np.int32(slot), np.int32(age), self._input("label", y))
        *state, status, loss, applied = out
        self._kept(state)
        status, loss, applied = self.host([status, loss, applied])
        return int(status), float(loss), bool(applied)

    def reset(self, slot: int):
        """``slot``'s state back to the initial one (an export of several slots; ``Programs.reset``)."""
        self._kept(list(self.program("reset")(*self._buffers, np.int32(slot))))

    def decode(self, vec, events: dict | None = None):
        """The step's output vector as (prediction, loss, applied) (``Programs._decode``); the
        per-slot events (outlier, rolled_back) go to ``events`` (default ``self.events``)."""
        pred, loss, applied, flags = self._layout
        above = vec > 0.5
        events = self.events if events is None else events
        for name, f in zip(self._event_names, above[flags].reshape(-1, self._n)):
            events[name] = f
        return (vec[pred].reshape(self._pred_shape), vec[loss],
                above[applied] if self._per_slot else bool(above[applied.start]))

    def state_dict(self) -> dict:
        """The state as the learner's ``state_dict()``: {name: numpy array}."""
        return self.map.named(self.host(self._buffers))

    def save(self, path, extra: dict | None = None):
        """Write the state as a checkpoint (``OnlineLearner.restore`` reads it)."""
        return write_checkpoint(path, self.state_dict(), self.manifest["signature"],
                                {"step": self.steps, **(extra or {})})
