"""A logger that imports ``logging`` when something is first logged: the runner logs only on
rare paths (an internal error, a skipped checkpoint, other optimizer settings), and
``logging`` with what it imports is resident memory every runner would hold otherwise."""
from __future__ import annotations

__all__ = ["LazyLogger"]


class LazyLogger:
    """Stands for ``logging.getLogger(name)``: its methods (``warning``, ``exception``, ...)
    are the logger's, looked up, and ``logging`` imported, on first use.

    >>> log = LazyLogger("streamtrace.example")
    >>> log.name, log.getEffectiveLevel() >= 0
    ('streamtrace.example', True)
    """

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr):
        import logging
        return getattr(logging.getLogger(self.name), attr)
