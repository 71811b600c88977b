"""Every batch the trainer receives, from its arrival to the batch the collector yields.

One owner for what happens to a worker's frames on the trainer's side of a
multi-process run:

* **decoding**: a batch message is hostile input, decoded once against the share
  this worker was asked for (:func:`~asyncrl._protocol.decode`), whatever it claims;
  a shared-memory notice is read out of the worker's slot
  (:class:`~.shared_batches.SharedBatches`, which owns the segments);
* **the compact-frame rule** (TorchRL's ``compact_obs``, owned by
  :mod:`~asyncrl._protocol.compact_frames`, whose module lists its three call sites):
  workers told so drop the ``("next", K)`` twins before sending; a worker of an
  earlier release does not, and its twins are dropped here, on receipt, so that every
  share of a round has one layout and the checks (:class:`~.checks.BatchChecker`,
  ``dropped=``) see what was asked. Only there: a worker that said it drops them
  and sends one anyway is refused by those checks, not silently corrected;
* **counting** by how each batch came (``statistics()``: shared memory or the socket,
  batches and tensor bytes, per worker and in all);
* **gathering and assembly**: in sync mode with shared memory, each share is copied
  from its slot straight into its place in the round's batch
  (:class:`~.round_gather.RoundGather`), and :meth:`BatchSink.join` gives the round's
  batch in TorchRL's layout (``cat_results``), joining the shares itself
  (:func:`~.round_gather.assemble`) when the round went otherwise than planned.

The coordinator calls :meth:`BatchSink.from_socket` and :meth:`BatchSink.from_slot`
before its state checks and counts a batch; the collector calls
:meth:`BatchSink.join` for each sync round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch
from tensordict import TensorDictBase

from .._observe.statistics import BatchArrivals
from .._protocol import Batch, SharedBatch, decode, drop_twins
from .config import CoordinatorConfig
from .records import Round, WorkerInfo
from .round_gather import RoundGather, assemble
from .shared_batches import SharedBatches

__all__ = ["BatchSink"]


class BatchSink:
    """Decodes, reads, compacts, counts and joins the workers' batches (see the module).

    >>> from tensordict import TensorDict
    >>> from .config import CoordinatorConfig
    >>> sink = BatchSink(CoordinatorConfig(sync=True, share_frames=[3, 3]))
    >>> share = TensorDict({"x": torch.ones(1, 3)}, [1, 3])
    >>> sink.join([share, share]).batch_size   # one env per worker, stacked: [workers, time]
    torch.Size([2, 3])
    >>> sink.shared.close()
    """

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        #: Local workers' batch segments (unlinked when a worker goes, and at the end).
        self.shared = SharedBatches(config)
        #: Sync mode with shared memory: the round's batch, gathered as notices arrive.
        self.gather = RoundGather(config.cat_results, share_frames=list(config.share_frames)) \
            if config.sync and config.shared_memory_batches else None
        #: Every worker's batches by how they came (``statistics()``).
        self.arrivals = BatchArrivals()

    def from_socket(self, worker: WorkerInfo, body: Any) -> Batch:
        """A batch message's body, decoded (hostile input: at most the worker's share,
        whatever it claims), counted as a socket batch, its twins dropped if due."""
        batch = decode(Batch, body, max_frames=self.config.share_of(worker.index))
        self._count(worker, shared_memory=False, nbytes=_tensor_bytes(body))
        return self._compact(worker, batch)

    def from_slot(self, worker: WorkerInfo, notice: SharedBatch,
                  round_: Round | None = None) -> Batch:
        """The batch a shared-memory notice points at, copied out of its slot: straight
        into its place in ``round_``'s batch when this sink gathers it (see
        :meth:`SharedBatches.receive` for what a notice must be)."""
        place = None
        if self.gather is not None and round_ is not None and round_.request == notice.request:
            place = partial(self.gather.take, round_, worker)
        batch = self.shared.receive(worker, notice, place)
        self._count(worker, shared_memory=True, nbytes=_tensor_bytes(batch.frames))
        return self._compact(worker, batch)

    def join(self, shares: list[TensorDictBase]) -> TensorDictBase:
        """A sync round's batch from its shares (ordered by worker index), in TorchRL's
        layout: the batch gathered as they came, or joined now by ``cat_results``."""
        return assemble(shares, self.config.cat_results, gather=self.gather)

    def counts(self) -> dict[str, Any]:
        """The run's totals (``CollectorStatistics``' fields of the same names)."""
        return {**self.arrivals.as_dict(), "shared_memory_fallbacks": self.shared.fallbacks}

    def _compact(self, worker: WorkerInfo, batch: Batch) -> Batch:
        # The compact-frame rule's second call site (compact_frames.py): a worker that
        # said it drops the twins is not corrected here but checked (BatchChecker).
        if self.config.compact_obs and not worker.drops_next_obs:  # an earlier release
            batch.frames = drop_twins(batch.frames)  # views: nothing is copied
        return batch

    def _count(self, worker: WorkerInfo, *, shared_memory: bool, nbytes: int) -> None:
        worker.arrivals.add(shared_memory=shared_memory, nbytes=nbytes)
        self.arrivals.add(shared_memory=shared_memory, nbytes=nbytes)


def _tensor_bytes(value: Any, depth: int = 0) -> int:
    """Tensor bytes in a decoded message body (our codec bounds its depth already)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, TensorDictBase):
        return sum(_tensor_bytes(leaf, depth + 1) for leaf in value.values(
            include_nested=True, leaves_only=True))
    if depth < 16 and isinstance(value, Mapping):
        return sum(_tensor_bytes(item, depth + 1) for item in value.values())
    if depth < 16 and isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return sum(_tensor_bytes(item, depth + 1) for item in value)
    return 0
