"""Eligibility traces: the compiler (jaxpr analysis) and the algorithms built on it."""
from .._imports import import_brainstate

import_brainstate()     # before brainstate is first imported: without matplotlib (see _imports)

from .algorithm import ETraceVjpAlgorithm
from .d_rtrl import D_RTRL
from .data import MultiStepData, SingleStepData
from .errors import CompileError, CompileWarning
from .es_d_rtrl import ES_D_RTRL, pp_prop
from .graph import Decision, ETraceGraph, HiddenGroup, WeightRelation, compile_graph
from .rtrl import RTRL
from .signals import Chain, KappaFilter, LearningSignal, RandomFeedback, SignalChain

__all__ = ["compile_graph", "ETraceGraph", "HiddenGroup", "WeightRelation", "Decision", "CompileError", "CompileWarning",
           "ETraceVjpAlgorithm", "D_RTRL", "ES_D_RTRL", "pp_prop", "RTRL", "SingleStepData",
           "MultiStepData", "LearningSignal", "SignalChain", "Chain", "RandomFeedback", "KappaFilter"]
