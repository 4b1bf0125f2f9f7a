"""A per-thread switch for how some learner functions trace (``TraceMode``): the exported
programs (``streamtrace export``) trace a few functions otherwise than the programs jax runs."""
from __future__ import annotations

import contextlib
import threading

import jax

__all__ = ["TraceMode"]


class TraceMode:
    """A switch, off unless a thread is inside ``enter()`` (nested blocks allowed).

    jax's trace caches are cleared on the way in and out: a jitted function traced one way is
    not reused the other way.

    Example::

        >>> mode = TraceMode()
        >>> with mode.enter():
        ...     inside = mode.on
        >>> inside, mode.on
        (True, False)
    """

    def __init__(self):
        self._local = threading.local()

    @property
    def on(self) -> bool:
        """Whether this thread is inside ``enter()``."""
        return bool(getattr(self._local, "depth", 0))

    @contextlib.contextmanager
    def enter(self):
        """The switch on for this thread while the block runs."""
        jax.clear_caches()
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1
            jax.clear_caches()
