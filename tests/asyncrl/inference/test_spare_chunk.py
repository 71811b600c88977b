"""An env worker's own chunk buffers give their large arrays' pages back between uses."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from asyncrl._inference.spare_chunk import RELEASE_THRESHOLD, SpareChunk

OBS = (4, 84, 84)  # an Atari frame stack: 28 KB a step


def resident_kb(array: np.ndarray) -> int:
    """How much of ``array``'s memory is resident, in kB: the present bit of each of its
    pages in ``/proc/self/pagemap`` (readable for one's own process, no privilege)."""
    page = mmap.PAGESIZE
    first = array.ctypes.data // page
    last = (array.ctypes.data + array.nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first + 1) * 8), dtype=np.uint64)
    return int((entries >> np.uint64(63)).sum()) * page // 1024


def layout() -> dict:
    return {("observation",): (np.uint8, OBS), ("next", "observation"): (np.uint8, OBS),
            ("action",): (np.int64, ()), ("collector", "worker_id"): (np.int64, ())}


def test_large_arrays_are_given_back_after_use_and_read_as_zeros() -> None:
    spare = SpareChunk(layout(), rows=1, steps=64)
    try:
        obs = spare.arrays[("observation",)]
        assert obs.nbytes >= RELEASE_THRESHOLD  # 64 x 28,224 bytes
        assert spare.releasable == [("observation",), ("next", "observation")]
        assert resident_kb(obs) == 0  # zeroed, never written: nothing resident
        obs[:] = 3
        assert resident_kb(obs) * 1024 >= obs.nbytes
        spare.release()
        assert resident_kb(obs) == 0
        assert not obs.any()  # what a released array reads until written again
        obs[0, 5] = 9  # and it is written again, the same memory as before
        assert int(obs.sum()) == 9 * obs[0, 5].size
    finally:
        del obs
        spare.close()


def test_small_and_constant_arrays_keep_what_they_hold() -> None:
    spare = SpareChunk(layout(), rows=2, steps=64, constant={("collector", "worker_id")},
                       threshold=0)
    try:
        assert ("collector", "worker_id") not in spare.releasable
        assert ("action",) in spare.releasable  # threshold 0: every array a chunk rewrites
        spare.arrays[("collector", "worker_id")].fill(5)
        spare.arrays[("action",)].fill(2)
        spare.release()
        assert (spare.arrays[("collector", "worker_id")] == 5).all()
        assert not spare.arrays[("action",)].any()
    finally:
        spare.close()


def test_close_is_idempotent_and_drops_the_arrays() -> None:
    spare = SpareChunk(layout(), rows=1, steps=64)
    spare.close()
    spare.close()
    assert spare.arrays == {} and spare.releasable == []
    spare.release()  # nothing mapped: nothing to do


@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_shapes_and_dtypes_are_the_layouts(dtype) -> None:
    spare = SpareChunk({("x",): (dtype, (3, 2))}, rows=4, steps=5, threshold=0)
    try:
        assert spare.arrays[("x",)].shape == (4, 5, 3, 2)
        assert spare.arrays[("x",)].dtype == np.dtype(dtype)
        assert spare.arrays[("x",)].flags.writeable
    finally:
        spare.close()
