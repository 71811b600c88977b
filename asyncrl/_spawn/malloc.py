"""A worker process gives its batch-sized buffers back to the system when it frees them.

glibc's malloc serves a large request (128 KiB at first) with its own ``mmap`` and
returns it on ``free``, but each such free raises that threshold to the size freed
(up to 32 MiB): from the first batch on, a worker's batch-sized buffers (the copy a
batch message sends, a decoded weight update) came from its arenas, which keep
freed memory. In the 4-worker pixel run (``benchmarks/pixels.py``) that was about
11 MB per worker (two batch copies held, one in use). A fixed threshold of
:data:`MMAP_THRESHOLD` stops the drift: what is smaller (a policy's activations,
per step) is still reused from the arenas, what is larger is unmapped when freed.
The trim threshold is set to twice that, as glibc's own rule would at that size
(a fixed mmap threshold leaves it at 128 KiB: a step's activations freed at the top
of the heap would be given back and faulted in again at every step).

Only in worker processes asyncrl starts, never in the user's own process; a
``MALLOC_MMAP_THRESHOLD_`` the user set wins (glibc read it at start). Not glibc
(musl, macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("asyncrl.worker")

#: Allocations of this many bytes or more are mapped on their own and unmapped when freed.
MMAP_THRESHOLD = 1 << 20

#: The variable glibc reads at start; when set, the user chose and this module does nothing.
ENV_VARIABLE = "MALLOC_MMAP_THRESHOLD_"

_M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


def return_large_buffers(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix this process's mmap threshold at ``threshold`` bytes (trim: twice); True when set.

    Never raises: the default allocator still works, only with more memory kept.
    """
    if ENV_VARIABLE in os.environ or not _is_glibc():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        done = bool(libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(threshold)))
        done = done and bool(libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(2 * threshold)))
    except (OSError, AttributeError) as exc:
        log.debug("malloc's mmap threshold not set: %r", exc)
        return False
    return done


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError, AttributeError):  # not a name this system knows
        return False


__all__ = ["ENV_VARIABLE", "MMAP_THRESHOLD", "return_large_buffers"]
