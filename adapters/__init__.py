"""Bridges between sensor buses and an engine (``bridge lsl``, ``bridge mqtt``), the cluster link
and ``replay``, installed as ``streamtrace.adapters``.

The ZeroMQ clients moved to :mod:`streamtrace.transport`; ``streamtrace.adapters.SensorClient``
and the other client names still work, with a ``DeprecationWarning``.
"""
_MOVED = ("SensorClient", "PushClient", "EngineError", "Prediction", "Subscriber", "WeightsSubscriber")
__all__ = []


def __getattr__(name):
    if name in _MOVED:
        import warnings

        from streamtrace import transport
        warnings.warn(f"streamtrace.adapters.{name} is streamtrace.transport.{name}", DeprecationWarning, stacklevel=2)
        return getattr(transport, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
