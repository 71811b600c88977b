"""The weight codec: how one version's tensors become what a transport moves, and back.

A scheme is a codec and a transport. The transport (a ZeroMQ message or its
chunks, a shared-memory block, a CUDA handle, a broadcast, Ray's object store)
moves ``{key: tensor}`` and says nothing about the values; the codec decides
what those tensors are:

* :meth:`WeightCodec.encode` (trainer, under the send's lock, once per version):
  the model's flat tensors -> the tensors that travel.
* :meth:`WeightCodec.decode` (worker, at the step boundary, once per applied
  version): the tensors that came -> full tensors for the model's keys, given the
  model's own (a delta adds to them, another dtype is cast back to theirs).
* :attr:`WeightCodec.name` travels in the meta (``WeightMeta.codec``; a relay
  forwards it with the rest): a worker whose codec differs refuses the version,
  naming both, instead of applying bytes it would read wrong.

:data:`FULL_TENSORS` is the codec of every scheme today: the model's tensors
travel as they are, and a receiver may point the model at what came (zero copy:
:attr:`WeightCodec.identity`). A scheme that sends deltas or another dtype is a
subclass with its codec (``codec = BFloat16Codec()``) and touches nothing else:
the senders and receivers of the ZeroMQ and shared-memory transports call the
codec around what they move; the transports that share the model's own memory
(live shared memory, CUDA IPC) or write straight into it (a process group, Ray)
take the identity codec only, and say so when given another
(:attr:`~asyncrl.weights.WeightSender.takes_codecs`).

Newest wins is :mod:`._newest`'s, whatever the codec: a codec that keeps state
(the last version for a delta) must encode each version against one the worker
is known to hold (the sender's acked versions), never against one it may skip.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

__all__ = ["FULL_TENSORS", "FullTensors", "WeightCodec"]


class WeightCodec:
    """Base class: what one version's tensors look like on the way (see the module docstring).

    >>> class Half(WeightCodec):  # float32 travels as float16, half the bytes
    ...     name = "half"
    ...     identity = False
    ...     def encode(self, flat):
    ...         return {k: t.half() if t.dtype == torch.float32 else t for k, t in flat.items()}
    ...     def decode(self, received, targets):
    ...         return {k: t.to(targets[k].dtype) for k, t in received.items()}
    >>> codec = Half()
    >>> sent = codec.encode({"w": torch.tensor([0.5, 1.0])})
    >>> sent["w"].dtype, codec.decode(sent, {"w": torch.zeros(2)})["w"].tolist()
    (torch.float16, [0.5, 1.0])
    """

    #: What travels in the meta (``WeightMeta.codec``); ``""``: full tensors (said by nothing).
    name: ClassVar[str] = ""
    #: True when what travels is the model's tensors as they are: a receiver may then
    #: point the model at what came, and a transport may share the model's own memory.
    identity: ClassVar[bool] = True

    def encode(self, flat: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """The tensors that travel for the model's ``flat`` tensors (``{"dotted.key": t}``)."""
        return flat

    def decode(self, received: Mapping[str, torch.Tensor],
               targets: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """Full tensors for ``targets``' keys (the model's own, not to be written here) from
        what came."""
        return received

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FullTensors(WeightCodec):
    """The model's tensors as they are: every scheme's codec today."""


FULL_TENSORS = FullTensors()
