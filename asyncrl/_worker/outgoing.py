"""How a collected batch leaves a worker: one copy, into shared memory or onto the wire.

A local worker the trainer gave shared-memory slots (``batch_slots.py``) copies the
batch into the next slot and sends only a notice. Otherwise the message gets its own
copy, because the rollout reuses its buffers for the next batch at once; that copy is
compact (``("next", obs)`` only where the following step does not repeat it) when the
trainer's welcome said it rebuilds compact batches, whole for a coordinator of an
earlier release. With TorchRL's ``compact_obs=True`` (the welcome's ``compact_obs``)
the ``("next", K)`` twins are dropped before either path: they are neither copied
into the slot (whose layout, made from the first batch, then lacks them) nor sent.
This is the compact-frame rule's first call site (of three: see
:mod:`~asyncrl._protocol.compact_frames`); which keys are twins is decided there,
by :func:`~asyncrl._protocol.compact_frames.drop_twins`, as at the other two.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from .._protocol import Batch, BatchSlots, SharedBatch, Welcome, compact, drop_twins
from .batch_slots import SlotWriter


class OutgoingBatches:
    """The one copy of each batch a worker sends, and where it goes.

    >>> out = OutgoingBatches()
    >>> out.compact, out.drop_next_obs, out.slots.attached
    (False, False, False)
    """

    def __init__(self) -> None:
        self.slots = SlotWriter()  # the trainer's shared-memory slots for our batches
        #: The welcome said the trainer rebuilds compact batches.
        self.compact = False
        #: The welcome said ``compact_obs``: the ``("next", K)`` twins are never sent.
        self.drop_next_obs = False

    def welcomed(self, welcome: Welcome) -> None:
        """What this admission's welcome says about the batches' form."""
        self.compact, self.drop_next_obs = welcome.compact_batches, welcome.compact_obs

    def detach(self) -> None:
        """Back to the wire: the admission that offered the slots is over."""
        self.slots.detach()

    def offered(self, offer: BatchSlots) -> None:
        self.slots.attach(offer)

    def take(self, frames: TensorDictBase, request: int) -> Batch | SharedBatch:
        """The message for ``frames`` (the rollout's buffers), made with one copy."""
        if self.drop_next_obs:
            frames = drop_twins(frames)  # a view without them: they are never copied
        if (shared := self.slots.write(frames, request)) is not None:
            return shared  # in the trainer's shared memory: the notice is all that travels
        if self.compact:
            return Batch(request, *compact(frames))
        return Batch(request, frames.clone())
