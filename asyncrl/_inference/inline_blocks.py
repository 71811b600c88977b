"""The collector's side of a remote env worker's blocks: tensors that travel in messages.

A remote env worker has no shared memory with the inference loop: its
observations come inline in each ``obs`` message and its answers go back inline
(:mod:`.remote_env_hosts`). :class:`InlineBlock` gives the loop the interface of
a shared-memory block over such tensors, and checks what came from the network
against the layout agreed at join. The worker's own end, torch-free, is
:class:`~asyncrl._inference.remote_env_stepper.InlineArrays`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["InlineBlock", "Layout", "describe", "dtype_name", "parse_dtype"]

Layout = dict[str, tuple[torch.dtype, tuple[int, ...]]]
_NUMPY_NAMES = frozenset({"bool", "uint8", "int8", "int16", "int32", "int64", "uint16",
                          "uint32", "uint64", "float16", "float32", "float64"})


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def describe(value: Any) -> str:
    """A short, bounded description of what came (for error messages)."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return f"{dtype_name(value.dtype)}{list(value.shape)}"
    if isinstance(value, Mapping):
        keys = list(value)[:8]
        return "{" + ", ".join(f"{str(k)[:32]!s}: {describe(value[k])}" for k in keys) + (
            ", ...}" if len(value) > 8 else "}")
    return type(value).__name__


class InlineBlock:
    """A shared-memory block's interface over tensors that travel in messages.

    ``write`` copies into preallocated tensors (the loop allocates nothing per
    step); :meth:`fill` first checks what came from the network against the
    layout agreed at join: the same keys, dtypes and shapes, or a ValueError
    naming what was expected and what came.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = dict(layout)
        self.tensors = {k: torch.zeros(shape, dtype=dtype) for k, (dtype, shape) in layout.items()}
        self.version = 0

    def write(self, tensors: Mapping[str, torch.Tensor], *, version: int = 0,
              slot: int = 0) -> None:
        for key, dst in self.tensors.items():
            dst.copy_(tensors[key])
        self.version = version

    def read_into(self, dst: Mapping[str, torch.Tensor], slot: int = 0) -> int:
        for key, out in dst.items():
            out.copy_(self.tensors[key])
        return self.version

    def fill(self, body: Any, what: str, version: int = 0) -> None:
        """Check ``body`` (``{key: tensor}``) against the layout, then copy it in."""
        expected = {k: f"{dtype_name(d)}{list(s)}" for k, (d, s) in self.layout.items()}
        # (numpy arrays: an env worker that ran where torch is, whose arrays travel as such)
        tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) and v.dtype.name in
                   _NUMPY_NAMES else v for k, v in body.items()} if isinstance(
                       body, Mapping) else None
        ok = tensors is not None and set(tensors) == set(self.layout) and all(
            isinstance(tensors[k], torch.Tensor) and tensors[k].dtype == d
            and tuple(tensors[k].shape) == s for k, (d, s) in self.layout.items())
        if not ok:
            raise ValueError(f"{what}: expected {expected}, got {describe(body)}")
        self.write(tensors, version=version)  # type: ignore[arg-type]

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass
