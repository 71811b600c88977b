"""No weight sync: workers keep their own weights, and a send raises instead of doing nothing."""

from __future__ import annotations

from typing import Any

from transports import Message

from ._errors import WeightSyncError
from ._receiver import WeightReceiver
from ._scheme import WeightSyncScheme
from ._sender import WeightSender, WorkerIds

__all__ = ["NoWeightSyncScheme"]


class _RefusingSender(WeightSender):
    async def send_async(self, weights: Any = None, worker_ids: WorkerIds = None) -> int:
        raise WeightSyncError(
            f"model {self.model_id!r} uses NoWeightSyncScheme: its weights are never sent. "
            "Use ZmqWeightSyncScheme or SharedMemWeightSyncScheme to update workers.")

    async def send_latest(self, worker_ids: WorkerIds = None, *,
                          direct: bool = False) -> int | None:
        return None  # nothing to catch up on: workers keep their own weights


class _RefusingReceiver(WeightReceiver):
    def _load(self, message: Message) -> Any:
        raise WeightSyncError(f"this worker does not sync the weights of {self.model_id!r} "
                              "(NoWeightSyncScheme)")


class NoWeightSyncScheme(WeightSyncScheme):
    """Workers keep their own weights. Sending raises instead of silently doing nothing.

    >>> NoWeightSyncScheme().to_config()
    {'scheme': 'none', 'strategy': 'tensordict'}
    """

    name = "none"
    _sender_class = _RefusingSender
    _receiver_class = _RefusingReceiver

    def _resolve(self, model_id: str, model: Any, root: Any) -> Any:
        return model  # nothing is ever applied: no model needed
