"""The collector's side of a remote env worker's blocks: tensors that travel in messages.

A remote env worker has no shared memory with the inference loop: its
observations come inline in each ``obs`` message and its answers go back inline
(:mod:`.remote_env_hosts`). :class:`InlineBlock` gives the loop the interface of
a shared-memory block over such tensors (what came from the network was decoded
against the layout agreed at join before it is written here: see
:mod:`asyncrl._protocol.central_inference`). The worker's own end, torch-free, is
:class:`~asyncrl._inference.remote_env_stepper.InlineArrays`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["InlineBlock", "Layout", "dtype_name"]

Layout = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class InlineBlock:
    """A shared-memory block's interface over tensors that travel in messages.

    ``write`` copies into preallocated tensors (the loop allocates nothing per
    step); what came from the network was decoded against the layout agreed at
    join first (:class:`~asyncrl._protocol.Observations`, :class:`~asyncrl._protocol.Actions`).
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = dict(layout)
        self.tensors = {k: torch.zeros(shape, dtype=dtype) for k, (dtype, shape) in layout.items()}
        self.version = 0

    def write(self, tensors: Mapping[str, Any], *, version: int = 0, slot: int = 0) -> None:
        for key, dst in self.tensors.items():
            src = tensors[key]
            # (numpy arrays: an env worker that ran where torch is, whose arrays travel as such)
            dst.copy_(torch.from_numpy(src) if isinstance(src, np.ndarray) else src)
        self.version = version

    def read_into(self, dst: Mapping[str, torch.Tensor], slot: int = 0) -> int:
        for key, out in dst.items():
            out.copy_(self.tensors[key])
        return self.version

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass
