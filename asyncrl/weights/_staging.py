"""Reusable host buffers for weight snapshots: a send copies into one, it allocates nothing.

A :class:`Stage` holds one snapshot of a model's weights in host memory, in the
structure the strategy extracts (TensorDict or state dict), so that it is the
message body itself. ZeroMQ sends it without a copy (its frames are views of
the stage), so a stage is busy until every peer it went to has acknowledged:
only then has ZeroMQ finished reading it. A stage sent to a peer that was lost
is retired instead of reused, since ZeroMQ may still hold its frames for it.

Weights on a CUDA device are staged through pinned host memory: one
non-blocking device-to-host copy per tensor, one wait on an event, instead of a
synchronous copy (and an allocation) per tensor at encoding time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from transports import Ticket, copy_into

from ._strategy import clone_weights, flat_tensors

__all__ = ["SPARE_STAGES", "Stage", "free_stage"]

#: Idle snapshot buffers kept for reuse beyond those in use.
SPARE_STAGES = 1


class Stage:
    """One reusable host snapshot of weights with a fixed layout (keys, dtypes, shapes)."""

    def __init__(self, weights: Any) -> None:
        flat = flat_tensors(weights)
        self.layout = _layout(flat)
        self.pinned = any(t.device.type == "cuda" for t in flat.values())
        #: The message body: same structure as ``weights``, in host memory.
        self.payload = _host_empty(weights) if self.pinned else clone_weights(weights)
        self.views = flat_tensors(self.payload)  # share memory with the payload's tensors
        self.nbytes = sum(t.numel() * t.element_size() for t in self.views.values())
        self.tickets: list[Ticket] = []  # transmissions ZeroMQ may still be reading
        self.retired = False

    def matches(self, flat: Mapping[str, torch.Tensor]) -> bool:
        """True if ``flat`` has this stage's keys, dtypes and shapes (and devices kind)."""
        return (_layout(flat) == self.layout
                and self.pinned == any(t.device.type == "cuda" for t in flat.values()))

    def fill(self, flat: Mapping[str, torch.Tensor]) -> None:
        """Copy ``flat`` (same layout) into the stage; returns once the copy is complete."""
        devices = set()
        for key, view in self.views.items():
            source = flat[key]
            if source.device.type == "cuda":
                # Queued on the source's current stream, after the work that wrote it;
                # pinned memory makes it a real asynchronous DMA copy.
                view.copy_(source.detach(), non_blocking=True)
                devices.add(source.device)
            else:
                copy_into(view, source)
        for device in devices:  # one wait for all the copies queued on that device
            torch.cuda.current_stream(device).synchronize()

    def transmitted(self, ticket: Ticket) -> None:
        """Note that ``ticket``'s message carries this stage's memory."""
        self.tickets.append(ticket)

    def busy(self) -> bool:
        """True while a transmission may still read the stage (or it was retired)."""
        pending = []
        for ticket in self.tickets:
            if ticket.pending:
                pending.append(ticket)
            elif ticket.lost:
                self.retired = True  # ZeroMQ may still hold the frames for the lost peer
        self.tickets = pending
        return self.retired or bool(pending)


def free_stage(stages: list[Stage], in_use: set[int], weights: Any,
               flat: Mapping[str, torch.Tensor]) -> tuple[Stage, list[Stage]]:
    """A stage nothing reads any more (reused) or a new one, and the stages to keep.

    ``in_use`` holds the ``id()`` of the stages a send still needs (the latest
    version, the queued ones); busy and in-use stages are kept, retired ones
    dropped, and at most :data:`SPARE_STAGES` idle ones of the same layout kept.
    """
    keep: list[Stage] = []
    free: list[Stage] = []
    for stage in stages:
        if stage.busy() or id(stage) in in_use:  # busy() first: it notes a retirement
            if not stage.retired:
                keep.append(stage)
        elif stage.matches(flat):
            free.append(stage)  # (a free stage of another layout is dropped)
    stage = free.pop() if free else Stage(weights)
    return stage, [*keep, stage, *free[:SPARE_STAGES]]


def _layout(flat: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    return [(key, t.dtype, tuple(t.shape)) for key, t in flat.items()]


def _host_empty(weights: Any) -> Any:
    """Pinned host tensors in the structure of ``weights`` (values left unset)."""
    if isinstance(weights, TensorDictBase):
        return weights.detach().apply(_pinned_like, device=torch.device("cpu"))
    if isinstance(weights, Mapping):
        return {k: _host_empty(v) for k, v in weights.items()}
    if isinstance(weights, torch.Tensor):
        return _pinned_like(weights)
    return weights


def _pinned_like(tensor: torch.Tensor) -> torch.Tensor:
    pin = tensor.device.type == "cuda"  # pinning needs a CUDA runtime; CPU sources need none
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
