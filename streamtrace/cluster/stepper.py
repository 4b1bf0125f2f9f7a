"""The engine's stepping for a worker: an ``EngineCore`` whose streams come and go with the
partitions the worker owns, each stream's state moved in and out of its slot exactly.

One message per compiled call (``ingest`` then ``tick``), as a single-process engine fed one
message at a time does: the program that serves a message is then the same in both (the
one-busy-slot call), which is what the bit-for-bit comparison with a single engine rests on
until the step is deterministic whatever the batching (docs/decisions/determinism.md).
"""
from __future__ import annotations

import copy
import math

import jax
import numpy as np

from .. import wire
from ..engine.config import ConfigError, EngineConfig
from ..engine.core import EngineCore, Stream
from ..learner.checkpoint import checkpoint_bytes, loads_checkpoint
from .slot_upgrade import fit_partition, is_mixture_leaf

__all__ = ["Stepper", "worker_config"]


def worker_config(cfg: EngineConfig) -> EngineConfig:
    """The engine settings a worker runs with: a model per stream (streams of one partition move
    between workers, so they cannot share weights), no idle eviction or parking (a stream's state
    lives in its partition's checkpoint), no local checkpoints, no weight broadcasts."""
    if cfg.engine.shared_weights:
        raise ConfigError("engine.shared_weights", "the cluster shards streams over workers, so each stream needs "
                          "its own model: set it to false")
    if cfg.learning.label_delay:     # no label messages through NATS, and a moved stream's window is not kept
        raise ConfigError("learning.label_delay", "the cluster takes data messages only: delayed labels need "
                          "one engine (streamtrace serve); set it to 0 for a worker")
    cfg = copy.deepcopy(cfg)
    cfg.engine.on_gap = "reject"     # a hole in the log is reported, never learned around
    cfg.engine.idle_timeout_s, cfg.engine.park_s = math.inf, 0.0
    cfg.checkpoint.dir, cfg.publish.weights_every, cfg.publish.predictions = "", 0, True
    return cfg


class Stepper:
    def __init__(self, cfg: EngineConfig):
        self.core = EngineCore(worker_config(cfg))
        L = self.core.learner
        example = L.read_slot(0)
        flat = jax.tree_util.tree_flatten_with_path(example)[0]
        self._treedef = jax.tree_util.tree_structure(example)
        # what a partition checkpoint must match: the model and learner settings and one slot's
        # arrays (not the slot count: workers may run with different engine.slots)
        sig = {k: v for k, v in L.signature().items() if k not in ("slots", "state", "state_dict")}
        sig["slot_state"] = [[jax.tree_util.keystr(p), list(np.shape(a)), np.asarray(a).dtype.str] for p, a in flat]
        self.signature = sig
        # a fresh slot's mixture, for a checkpoint of another mixture (slot_upgrade.py)
        self._fresh_mixture = {j: np.asarray(a) for j, (p, a) in enumerate(flat)
                               if is_mixture_leaf(jax.tree_util.keystr(p))}

    def warmup(self):
        """Compile what a worker uses: the one-busy-slot step (the program ``tick`` picks for
        it, as in an engine that did not warm up) and the slot reads and writes."""
        core, L = self.core, self.core.learner
        if core.subsets:
            L.programs.subset(core.subsets[0], core.cfg.engine.micro_batch)
        else:
            L.programs.step()
        L.programs.reset()
        L.write_slot(0, L.read_slot(0))

    # ---- one message --------------------------------------------------------------------
    def step(self, raw: bytes, stream: str, *, stop_at_hole: bool = False) -> tuple[str, bytes]:
        """("pred", reply) or ("error", error message). A message whose 'stream' is not the
        one its subject names is refused: its state would land in another partition. With
        ``stop_at_hole``, a data message that skips ahead of the sequence number its stream
        expects is not stepped: ("hole", b"") (without, the engine refuses it as a "gap")."""
        try:
            msg = wire.decode(raw, self.core.cfg.engine.max_message_bytes)
            if msg["type"] != "data":
                return "error", self._refusal("bad_type", f"the cluster takes 'data' messages only; got "
                                              f"{msg['type']!r}", msg)
            if msg.get("stream") != stream:
                return "error", self._refusal("bad_stream", f"message for stream {msg.get('stream')!r} was "
                                              f"published on the subject of stream {stream!r}", msg)
            known = self.core.streams.get(stream)
            seq = msg.get("seq")
            if stop_at_hole and known is not None and known.next_seq is not None and isinstance(seq, int) \
                    and seq > known.next_seq:
                return "hole", b""
        except wire.WireError:
            pass      # ingest refuses it with the same error as the engine
        out = self.core.ingest(raw) or self.core.tick()
        for kind, topic, body in out:
            if topic.startswith(b"pred/"):
                return "pred", body
        return "error", next(body for _, topic, body in out if topic == b"error")

    def _refusal(self, code, message, msg) -> bytes:
        self.core.metrics.count("received")
        stream, seq = msg.get("stream"), msg.get("seq")
        ok = isinstance(stream, str) and isinstance(seq, int) and not isinstance(seq, bool)
        return self.core._refuse(None, code, message, stream if ok else None, seq if ok else None)[0][2]

    # ---- streams in and out -------------------------------------------------------------
    def streams(self) -> dict:
        return self.core.streams

    def drop(self, names):
        """Free the slots of ``names`` (their partition moved away; its checkpoint holds them)."""
        core = self.core
        for name in names:
            st = core.streams.pop(name, None)
            if st is not None:
                core.free.append(st.slot)
                core.metrics.forget(name)

    def snapshot(self, names, seq: int, extra: dict) -> bytes:
        """A checkpoint of streams ``names``: each one's slot state and next sequence number,
        and ``seq``, the last log sequence it covers (the learner checkpoint format)."""
        core, arrays, listed = self.core, {}, []
        for i, name in enumerate(sorted(names)):
            st = core.streams[name]
            for j, leaf in enumerate(jax.tree_util.tree_leaves(core.learner.read_slot(st.slot))):
                arrays[f"s{i}.{j}"] = np.asarray(leaf)
            listed.append([name, st.next_seq])
        return checkpoint_bytes(arrays, self.signature, {**extra, "seq": seq, "streams": listed})

    def restore(self, raw: bytes, label: str) -> tuple[int, list[str]]:
        """Load a checkpoint from ``snapshot`` into free slots: (log seq it covers, stream names).
        Raises CheckpointError (another model, damaged) or RuntimeError (no free slot). One of
        another experts' mixture (an older release's) resumes all else, the mixture afresh,
        with a logged warning (slot_upgrade.py)."""
        arrays, header = loads_checkpoint(raw, label)
        arrays = fit_partition(label, self.signature, header, arrays, self._fresh_mixture)
        extra, core = header["extra"], self.core
        n = self._treedef.num_leaves
        names = []
        for i, (name, next_seq) in enumerate(extra["streams"]):
            slot = core._take_slot(fresh=False)
            if slot is None:
                raise RuntimeError(f"no free slot for stream {name!r}: raise engine.slots (every stream of the "
                                   f"partitions a worker owns needs one; {core.cfg.engine.slots} now)")
            part = jax.tree_util.tree_unflatten(self._treedef, [arrays[f"s{i}.{j}"] for j in range(n)])
            core.learner.write_slot(slot, part)
            core.streams[name] = Stream(slot, next_seq)
            names.append(name)
        return int(extra["seq"]), names
