"""A local request or answer block's slot as plain arrays: no call into the block per step.

A local env worker and the inference loop exchange each step through two
one-slot :class:`transports.SharedTensorBlock` s (:mod:`.doorbell`); the env worker,
torch-free, attaches them as :class:`transports.SharedArrayBlock` s (numpy views of
the same slots). The
block's own ``write`` / ``read_into`` check keys, shapes and the slot on every
call and go through ``copy_into``'s dtype tests: 10-20 µs of Python per step on
this project's 2-core VM, as much as a Pendulum step. Here the checks are made
once, when the arrays are made; a step then costs one ``np.copyto`` per tensor
and two stores into the slot's control words.

The protocol is the block's seqlock (``transports._shm_format``'s layout): the writer
makes the slot's sequence number odd, copies, stores the version, makes the
sequence number even again (two more than before). Request and answer
alternate (a worker writes its observations only once its previous answer is
read, the loop its answer only once the request came), so a reader that saw
the new sequence number reads a slot that nobody writes meanwhile. The block's
``latest()`` (which slot was written last) is not kept: these blocks have one
slot, and nobody asks.

>>> import torch
>>> from transports import SharedTensorBlock
>>> block = SharedTensorBlock.create({"o0": torch.zeros(2, 3)}, slots=1)
>>> slot = SlotArrays(block)
>>> slot.publish(slot.copies_from([torch.ones(2, 3).numpy()]), version=7)
2
>>> block.read(0)[0], bool((block.read(0)[1]["o0"] == 1).all())
(7, True)
>>> slot.release(); block.close(); block.unlink()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch only where a tensor was given: an env worker has none
    import torch

__all__ = ["Copy", "SlotArrays", "array_of", "copier"]

#: One copy of a step: ``(copy, dst, src)``, ``copy(dst, src)`` does it.
Copy = tuple[Callable[[Any, Any], Any], Any, Any]


def array_of(tensor: torch.Tensor | np.ndarray) -> Any:
    """``tensor`` as a numpy array sharing its memory, or itself when numpy lacks its dtype.

    A numpy array (a torch-free env worker's) is its own array.
    """
    if isinstance(tensor, np.ndarray):
        return tensor
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError):  # bfloat16 and friends, or a tensor numpy can't view
        return tensor


def _torch_copy(dst: torch.Tensor, src: Any) -> None:
    import torch  # (dst is a tensor: this process has torch)

    dst.copy_(src if isinstance(src, torch.Tensor) else torch.from_numpy(src))


def _numpy_copy(dst: np.ndarray, src: Any) -> None:
    if isinstance(src, np.ndarray):
        np.copyto(dst, src)
    else:  # a tensor numpy could not view (array_of gave it back as is)
        import torch

        torch.from_numpy(dst).copy_(src)


def copier(dst: Any) -> Callable[[Any, Any], Any]:
    """The copy for ``dst`` (an :func:`array_of` result): ``np.copyto`` or a torch ``copy_``."""
    return _numpy_copy if isinstance(dst, np.ndarray) else _torch_copy


class SlotArrays:
    """One slot of a block (slot 0 by default): its tensors as arrays (layout order) and its
    control words. An env worker whose envs step in splits asks and is answered through
    one slot per split (:class:`~asyncrl._inference.inference_loop.InferenceLoop`'s lanes).

    ``word`` is the slot's live ``[seq, version]`` (int64, in the shared memory).
    A write is :meth:`begin`, the copies into :attr:`arrays` (the caller's: it
    knows its sources), :meth:`end`. Hold the arrays only while the block is
    open: :meth:`release` lets the mapping go.
    """

    def __init__(self, block: Any, slot: int = 0) -> None:
        self.keys = list(block.layout)
        views = block.slot_views(slot)
        self.arrays = [array_of(views[k]) for k in self.keys]
        self.copies = [copier(a) for a in self.arrays]  # the copy into each array
        self.word = block.control(slot)

    def copies_from(self, sources: Sequence[Any]) -> list[Copy]:
        """A :data:`Copy` into each array from ``sources`` (layout order): made once."""
        if len(sources) != len(self.arrays):
            raise ValueError(f"{len(sources)} sources for the block's {len(self.arrays)} tensors")
        return list(zip(self.copies, self.arrays, sources, strict=True))

    def begin(self) -> int:
        """Start a write (the sequence number goes odd); the number to give :meth:`end`."""
        word = self.word
        seq: int = word[0]
        if seq & 1:
            seq += 1  # a writer died mid-write: the slot holds garbage, start a clean round
        word[0] = seq + 1  # odd: a reader of this slot would see the tear
        return seq + 2

    def end(self, seq: int, version: int) -> None:
        """Publish the write: its version, then the sequence number from :meth:`begin`."""
        word = self.word
        word[1] = version
        word[0] = seq

    def publish(self, copies: Sequence[Copy], version: int) -> int:
        """A whole write of :meth:`copies_from`'s copies as ``version``; the new seq number."""
        seq = self.begin()
        for copy, dst, src in copies:
            copy(dst, src)
        self.end(seq, version)
        return seq

    def release(self) -> None:
        """Drop the views of the block's memory (the block can then be unmapped)."""
        if isinstance(self.word, memoryview):
            self.word.release()
        self.arrays, self.copies = [], []
