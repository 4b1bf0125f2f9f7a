"""Where jax runs a compiled step: on the calling thread (inline) or handed to its worker thread.

jax's CPU client hands each call to a worker thread by default (async dispatch), so Python can
go on while it runs. An online step is awaited at once (its prediction is the answer), so the
hand-off buys nothing, and on a small multi-CPU machine each one is a cross-CPU wake-up.
Inline is the faster of the two there (measured in docs/benchmarks.md, "Inline dispatch"). The
setting is read once, when jax starts its CPU backend, and holds for the whole process, so
it belongs to whoever owns the process: the engine, the CLI's commands, a benchmark.
"""
from __future__ import annotations

__all__ = ["inline_dispatch"]


def inline_dispatch() -> bool:
    """Have jax run compiled CPU programs on the calling thread from now on. Returns False
    (and changes nothing) when jax's backend is already running: call it before any jax work."""
    import jax
    from jax._src import xla_bridge
    if xla_bridge.backends_are_initialized():
        return False
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    return True
