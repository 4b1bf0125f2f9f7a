"""The C heap's free pages given back to the system after a state is loaded.

Loading a state (the folder's initial one, a checkpoint, a new stream's) holds its arrays on
the host until they are copied into the runtime's buffers; freed, those pages stay in the
process's heap (glibc keeps what is not at its top, and its mmap threshold grows with each
large block freed, so later large blocks come from the heap). ``trim`` returns them
(glibc's ``malloc_trim``), so a load's transient copies do not stay in the resident memory.
Elsewhere (musl, macOS) it does nothing."""
from __future__ import annotations

__all__ = ["trim"]

_trim = None        # glibc's malloc_trim, False where the C library has none


def trim() -> bool:
    """Give the C heap's free pages back to the system; True if some were released (False
    where the C library has no ``malloc_trim``).

    >>> trim() in (True, False)
    True
    """
    global _trim
    if _trim is None:
        try:
            import ctypes           # (numpy has imported it already: no memory of its own)
            _trim = ctypes.CDLL(None).malloc_trim
            _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            _trim = False
    return bool(_trim(0)) if _trim else False
