"""Eligibility traces: the compiler that reads a model's step, and the algorithms built on it.

``compile_graph(model, x)`` traces one step of a model (its jaxpr) and decides, for every
weight, how it learns online: an eligibility trace where its output drives a hidden state,
an instant gradient where it only feeds the output; a model the algorithms cannot handle
correctly raises ``CompileError``. The algorithms ``D_RTRL`` (a trace per weight),
``ES_D_RTRL`` / ``pp_prop`` (low-rank traces) and ``RTRL`` (exact) are built on that graph,
and learning signals (``RandomFeedback``, ``KappaFilter``, ``SignalChain``) change how the
loss reaches the hidden state. ``OnlineLearner`` builds these for you from ``st.d_rtrl()``
and the like; use this package to inspect a model or build an algorithm by hand.

>>> import brainstate, jax.numpy as jnp, streamtrace as st
>>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
>>> _ = brainstate.nn.init_all_states(model)
>>> graph = st.etrace.compile_graph(model, jnp.zeros(1))
>>> graph.hidden_names, "cell.z.W" in graph.trace_params, "out.W" in graph.trace_params
(('cell.h',), True, False)
"""
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
