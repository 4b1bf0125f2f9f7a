"""The runner's process gives freed memory back: glibc's malloc serves a large allocation
(over its mmap threshold) from a mapping of its own, returned when freed, but raises that
threshold after such a free (up to 32 MiB), so later arrays of the same size come from the
heap and stay resident. The runner fixes the threshold at 128 KiB: the arrays it reads a
checkpoint into while it starts (the default learner's: a megabyte) go back, and a peak is
not kept as the floor."""
from __future__ import annotations

__all__ = ["return_freed_memory"]

_M_MMAP_THRESHOLD = -3        # mallopt's parameter number (malloc.h)


def return_freed_memory(threshold: int = 1 << 17) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; False where the C library is not
    glibc (nothing changed).

    >>> return_freed_memory() in (True, False)
    True
    """
    try:
        import ctypes
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False
