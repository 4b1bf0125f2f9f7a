"""streamtrace: streaming online learning for recurrent and spiking networks."""
from ._imports import import_brainstate

import_brainstate()     # before anything imports brainstate: without matplotlib (see _imports)

from . import nn  # noqa: E402
from .etrace import (
                     D_RTRL,
                     ES_D_RTRL,
                     RTRL,
                     CompileError,
                     CompileWarning,
                     ETraceGraph,
                     ETraceVjpAlgorithm,
                     KappaFilter,
                     MultiStepData,
                     RandomFeedback,
                     SingleStepData,
                     compile_graph,
                     pp_prop,
)
from .learner import CheckpointError, Forecast, OnlineLearner, chain, normalise, param_groups, residual, rls

__all__ = ["nn", "OnlineLearner", "CheckpointError", "compile_graph", "ETraceGraph", "CompileError", "CompileWarning", "ETraceVjpAlgorithm", "D_RTRL",
           "ES_D_RTRL", "pp_prop", "RTRL", "SingleStepData", "MultiStepData", "RandomFeedback",
           "KappaFilter", "Forecast", "chain", "normalise", "residual", "rls", "param_groups"]
__version__ = "0.1.0"
