"""streamtrace: streaming online learning for recurrent and spiking networks.

The names below are imported on first use: a sensor client, a bridge or the wire protocol
(``streamtrace.adapters``, ``streamtrace.wire``) does not load jax and brainstate."""
import importlib

__version__ = "0.1.0"

_FROM = {
    ".etrace": ("D_RTRL", "ES_D_RTRL", "RTRL", "CompileError", "CompileWarning", "ETraceGraph", "ETraceVjpAlgorithm",
                "KappaFilter", "MultiStepData", "RandomFeedback", "SingleStepData", "compile_graph", "pp_prop"),
    ".learner": ("Algorithm", "CheckpointError", "CompileSettings", "Forecast", "Metrics", "OnlineLearner", "Slots",
                 "Supervised", "adam", "chain", "d_rtrl", "es_d_rtrl", "experts", "feedback", "frozen", "normalise",
                 "param_groups", "residual", "rls", "rtrl", "screen"),
}
_WHERE = {name: mod for mod, names in _FROM.items() for name in names}
__all__ = ["nn", *_WHERE]


def __getattr__(name):
    if name == "nn":
        return importlib.import_module(".nn", __name__)
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
