"""Serving an exported learner without jax: ``Runner`` steps an IREE module of the learning step
(``streamtrace export``), ``RunnerServer`` serves it over ``serve``'s wire protocol
(``streamtrace-runner FOLDER``), with ``serve``'s checkpoints. Needs numpy, pyzmq, msgpack and
``iree-base-runtime`` only; also shipped alone as the ``streamtrace-runner`` distribution
(``pip install ./runner``).

>>> from streamtrace.runtime.streams import StreamTable
>>> StreamTable(2).free
[0, 1]
"""
_LAZY = {"Runner": ".runner", "RunnerError": ".runner", "RunnerServer": ".server", "RunnerSettings": ".server",
         "RunnerCore": ".core"}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
