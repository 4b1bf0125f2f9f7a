"""The online learner: one compiled step per sample, many streams, exact checkpoints."""
from .checkpoint import (
           CheckpointDir,
           CheckpointError,
           read_checkpoint,
           write_checkpoint,
)
from .core import OnlineLearner, StepResult
from .losses import LOSSES
from .packing import Layout

__all__ = ["OnlineLearner", "StepResult", "Layout", "LOSSES", "CheckpointError", "CheckpointDir",
           "read_checkpoint", "write_checkpoint"]
