"""Checkpoint files: the format lives in ``streamtrace.checkpoints`` (numpy only, so that the
jax-free runner of an exported learner, ``streamtrace.export.runner``, writes the same files);
the learner and the engine import it from here."""
from ..checkpoints import (CheckpointDir, CheckpointError, check_signature, checkpoint_bytes, description_diff,
                           loads_checkpoint, optimizer_diff, read_checkpoint, signature_diff, signature_without,
                           write_checkpoint)

__all__ = ["CheckpointError", "write_checkpoint", "read_checkpoint", "checkpoint_bytes", "loads_checkpoint",
           "CheckpointDir", "check_signature", "description_diff", "optimizer_diff", "signature_diff", "signature_without"]
