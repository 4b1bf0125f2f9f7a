"""streamtrace: streaming online learning for recurrent and spiking networks, one time step at a
time, with eligibility traces.

The names a user needs (``st.__all__``):

- **The learner**: ``OnlineLearner`` (``step``, ``label``, ``save``, ``restore``), its modes
  ``Forecast`` and ``Supervised``, ``Slots`` (many independent streams), ``Metrics`` (rolling
  prequential scores).
- **How the weights learn**: the algorithms ``d_rtrl``, ``es_d_rtrl``, ``rtrl``; the optimizers
  ``adam`` (any optax transform works too), ``frozen``, and ``param_groups`` (one per group of
  weights).
- **Around the model**: the signal transforms ``chain``, ``screen``, ``normalise``, ``residual``,
  ``feedback``; the readout ``rls``; the mixture ``experts``.
- **Models**: ``st.nn`` (recurrent and spiking cells, stacks, reservoirs).
- **The compiler**: ``st.etrace`` (``compile_graph``, ``D_RTRL``, ``ES_D_RTRL``, ``RTRL``,
  learning signals, ``CompileError``): what the algorithms are built on.

The names are imported on first use: a sensor client, a bridge or the wire protocol
(``streamtrace.adapters``, ``streamtrace.wire``) does not load jax and brainstate.

>>> import streamtrace as st
>>> len(st.__all__) <= 20, "OnlineLearner" in st.__all__
(True, True)
"""
import importlib

__version__ = "0.1.0"

_LEARNER = ("OnlineLearner", "Forecast", "Supervised", "Slots", "Metrics", "d_rtrl", "es_d_rtrl", "rtrl", "adam",
            "frozen", "param_groups", "chain", "screen", "normalise", "residual", "feedback", "rls", "experts")
# reachable as before, not among the names a user needs first
_ALSO = {"CheckpointError": ".learner", "CompileSettings": ".learner", "Algorithm": ".learner"}
# the compiler's names: st.etrace.<name>; st.<name> still works, with a DeprecationWarning
_COMPILER = ("D_RTRL", "ES_D_RTRL", "RTRL", "CompileError", "CompileWarning", "ETraceGraph", "ETraceVjpAlgorithm",
             "KappaFilter", "MultiStepData", "RandomFeedback", "SingleStepData", "compile_graph", "pp_prop")
_WHERE = {**{name: ".learner" for name in _LEARNER}, **_ALSO}
_SUBPACKAGES = ("nn", "etrace", "learner", "recipe")
__all__ = ["nn", "etrace", *_LEARNER]


def __getattr__(name):
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    if name in _COMPILER:
        import warnings
        warnings.warn(f"streamtrace.{name} is streamtrace.etrace.{name} (the compiler's names left the top "
                      "level)", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(".etrace", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
