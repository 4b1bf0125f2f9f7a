"""The C heap: the blocks every step allocates kept for the next step, and the free pages
given back to the system after a state is loaded.

IREE's runtime allocates each call's results and scratch buffers from the C heap and frees
them when the next call has replaced them. glibc's malloc takes a large block from the system
(``mmap``) or gives the heap's top back (trimming) by thresholds it moves as blocks come and
go; a step whose blocks sit across those thresholds then maps, faults in and unmaps fresh
pages on every call (measured: a GRU-64 step three times slower, from the first step on, in
some processes and not others: docs/devices.md). ``keep_freed`` fixes both thresholds high, so
a step's freed blocks serve the next step.

Loading a state (the folder's initial one, a checkpoint, a new stream's) holds its arrays on
the host until they are copied into the runtime's buffers; freed, those pages stay in the
process's heap. ``trim`` returns them (glibc's ``malloc_trim``, which gives back every free
page whatever the thresholds), so a load's transient copies do not stay in the resident memory.
Elsewhere (musl, macOS) both do nothing."""
from __future__ import annotations

__all__ = ["keep_freed", "trim"]

_trim = None        # glibc's malloc_trim, False where the C library has none
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3       # glibc's mallopt parameters (malloc.h)
LARGEST = 32 << 20      # blocks up to this size come from the heap (glibc's own upper bound)


def keep_freed() -> bool:
    """Keep the C heap's freed blocks for reuse (up to ``LARGEST`` bytes each, and up to
    ``2 * LARGEST`` free bytes at the heap's top), for this whole process; True where the C
    library took the settings (glibc's ``mallopt``), else False.

    >>> keep_freed() in (True, False)
    True
    """
    try:
        import ctypes
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, LARGEST)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * LARGEST))


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
