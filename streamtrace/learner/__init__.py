"""The online learner: one compiled step per sample, many streams, exact checkpoints."""
from .._imports import import_brainstate

import_brainstate()     # before brainstate is first imported: without matplotlib (see _imports)

from .adam import adam
from .adaptive_forgetting import adaptive_forgetting
from .algorithms import Algorithm, d_rtrl, es_d_rtrl, rtrl
from .checkpoint import (
           CheckpointDir,
           CheckpointError,
           read_checkpoint,
           write_checkpoint,
)
from .online import OnlineLearner, StepResult
from .experts import experts
from .feedback import feedback
from .groups import param_groups
from .losses import LOSSES
from .modes import Forecast, Supervised
from .normalise import normalise
from .optimizers import frozen
from .packing import Layout
from .residual import residual
from .rls import rls
from .screen import screen
from .settings import CompileSettings, Metrics, Slots
from .transforms import chain

__all__ = ["OnlineLearner", "StepResult", "Layout", "LOSSES", "CheckpointError", "CheckpointDir",
           "read_checkpoint", "write_checkpoint", "Forecast", "normalise", "residual", "chain", "rls",
           "param_groups", "adam", "experts", "feedback", "Algorithm", "d_rtrl", "es_d_rtrl", "rtrl",
           "frozen", "Supervised", "Slots", "CompileSettings", "Metrics", "adaptive_forgetting", "screen"]
