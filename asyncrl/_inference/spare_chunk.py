"""An env worker's own chunk buffers, whose large arrays go back to the system between uses.

A local env worker records a chunk straight into its ring slot when the trainer has
freed that slot as the chunk starts (:mod:`.chunk_writer`); when it has not (the
trainer waits on slower workers before it cuts a batch), the chunk is recorded into
the worker's own buffers and copied into the slot once it is free. On real Atari
(``benchmarks.atari``, 8 env workers) that was 5-17 % of chunks, so the own buffers
were written often enough to stay resident but held nothing most of the time:
observations and next observations, 3.6 MB a worker (64 steps x 56 KB).

So each array of ``threshold`` bytes or more is mapped on its own, privately, and
:meth:`SpareChunk.release` gives its pages back (``MADV_DONTNEED``) once the chunk
was copied out: it reads as zeros until written again, which costs a page fault per
4 KB at the next use (about a millisecond for 3.6 MB, against the ~0.4 s the chunk
takes to step). Only arrays every chunk rewrites whole are released; the columns a
buffer holds from the start (``constant``: the worker's id, the root flags) never are.
A remote env worker records every chunk into these buffers and never releases them.

>>> import numpy as np
>>> spare = SpareChunk({("obs",): (np.uint8, (4, 84, 84)), ("id",): (np.int64, ())},
...                    rows=2, steps=64, constant={("id",)})
>>> spare.arrays[("obs",)].shape, spare.releasable
((2, 64, 4, 84, 84), [('obs',)])
>>> spare.arrays[("obs",)][:] = 7
>>> spare.release()
>>> int(spare.arrays[("obs",)].max())
0
>>> spare.close()
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

__all__ = ["RELEASE_THRESHOLD", "SpareChunk"]

Path = tuple[str, ...]

#: Arrays this large or larger are mapped on their own and released after each use
#: (glibc's mmap threshold that asyncrl's workers use: :mod:`asyncrl._spawn.malloc`).
RELEASE_THRESHOLD = 1 << 20


class SpareChunk:
    """Zeroed ``[rows, steps, *shape]`` arrays of a chunk layout; :meth:`release` after use.

    ``layout``: ``path -> (dtype, per-env shape)``; ``dtype_of`` turns a layout's dtype
    into numpy's; ``constant``: paths a chunk does not rewrite (never released);
    ``threshold``: the smallest array released, in bytes (:data:`RELEASE_THRESHOLD`).
    """

    def __init__(self, layout: Mapping[Path, tuple[Any, tuple[int, ...]]], *, rows: int,
                 steps: int, constant: Collection[Path] = (),
                 dtype_of: Callable[[Any], np.dtype] = np.dtype,
                 threshold: int | None = None) -> None:
        threshold = RELEASE_THRESHOLD if threshold is None else threshold
        self.arrays: dict[Path, np.ndarray] = {}
        #: The paths :meth:`release` gives back (mapped on their own).
        self.releasable: list[Path] = []
        self._maps: list[mmap.mmap] = []
        for path, (dtype, shape) in layout.items():
            numpy_dtype, full = dtype_of(dtype), (rows, steps, *shape)
            nbytes = int(np.prod(full, dtype=np.int64)) * numpy_dtype.itemsize
            if nbytes < threshold or path in constant:
                self.arrays[path] = np.zeros(full, dtype=numpy_dtype)
                continue
            # Private and anonymous: MADV_DONTNEED frees its pages (zeros when read
            # again); a shared mapping would keep them in the page cache.
            mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self._maps.append(mapping)
            self.arrays[path] = np.frombuffer(mapping, dtype=numpy_dtype).reshape(full)
            self.releasable.append(path)

    def release(self) -> None:
        """Give the large arrays' pages back to the system; they read as zeros until written."""
        for mapping in self._maps:
            mapping.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Drop the arrays and unmap them (idempotent; views of them must be gone)."""
        self.arrays, self.releasable = {}, []
        maps, self._maps = self._maps, []
        for mapping in maps:
            try:
                mapping.close()
            except BufferError:  # a view still exported: unmapped when it goes
                pass
