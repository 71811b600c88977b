"""What a listening coordinator lets peers it has not admitted make it hold in memory."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import torch

from transports import STRANGER_MAX_BYTES

from .._rollout.env_specs import EnvSpecs

#: The smallest default cap on one message from a peer (batches, acks, state dicts).
MIN_MESSAGE_BYTES = 64 << 20


def listening_hub_limits(specs: dict[str, Any] | None, *, frames: int,
                         policy: torch.nn.Module | None,
                         max_message_bytes: int | None = None) -> dict[str, Any]:
    """``Hub`` options for a hub that listens on a network.

    ZeroMQ assembles a whole message, up to the socket's ``MAXMSGSIZE``, before
    anyone can see who sent it, so that cap bounds what each connection can
    make us hold; it was 4 GiB. The hub admits only the peers the scheduler
    welcomed; a stranger's messages above 1 MiB (or 4x the reference specs, so
    that a hello fits) are dropped unread.
    """
    limit = max_message_bytes or inbound_limit(specs, frames=frames, policy=policy)
    hello = 4 * len(msgpack.packb(specs)) if specs is not None else 0
    return {"admission": True, "max_bytes": limit,
            "stranger_max_bytes": min(limit, max(STRANGER_MAX_BYTES, hello))}


def inbound_limit(specs: dict[str, Any] | None, *, frames: int,
                  policy: torch.nn.Module | None) -> int:
    """The default cap: ``max(64 MiB, 4 x a batch, 2 x the policy's weights + 16 MiB)``.

    A batch of ``frames`` frames is estimated from the env specs: two
    observations, an action, 8 bytes per discrete action (logits, probabilities)
    and 256 bytes of flags, ids and policy outputs per frame; 4 KiB per frame
    without usable specs. The policy term covers ``state_dict()`` answers.
    Pass ``max_message_bytes`` to the collector to choose yourself.
    """
    per_frame = 4096
    try:
        parsed = EnvSpecs.from_dict(specs) if specs is not None else None
    except ValueError:
        parsed = None
    if parsed is not None:
        obs = sum(s.numel * _itemsize(s.dtype) for s in parsed.flat_observation().values())
        action = parsed.action.numel * _itemsize(parsed.action.dtype)
        per_frame = 2 * obs + action + 8 * (parsed.action.n or 0) + 256
    weights = 0
    if policy is not None:
        weights = sum(t.numel() * t.element_size() for t in policy.state_dict().values())
    return max(MIN_MESSAGE_BYTES, 4 * frames * per_frame, 2 * weights + (16 << 20))


def _itemsize(dtype: str) -> int:
    return int(np.dtype(dtype).itemsize)
