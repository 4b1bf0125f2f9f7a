"""Transport edges (ZeroMQ sources and sinks), installed as ``streamtrace.adapters``."""
