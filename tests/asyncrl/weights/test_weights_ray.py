"""RayWeightSyncScheme and RayWeightUpdater without a Ray cluster: configuration, hostile
messages refused before Ray is asked anything, and TorchRL's ``max_interval`` counting.

The end-to-end runs on two raylets are in tests/multihost/test_ray_weights.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

from asyncrl.weights import (
    RayWeightSender,
    RayWeightSyncScheme,
    RayWeightUpdater,
    WeightSyncError,
    WeightSyncScheme,
)
from asyncrl.weights._collective import FlatLayout
from transports import Message, ProtocolError


def test_the_scheme_travels_to_remote_workers_by_config() -> None:
    scheme = RayWeightSyncScheme(timeout=5, max_interval=2)
    assert scheme.to_config() == {"scheme": "ray", "strategy": "tensordict",
                                  "max_interval": 2, "timeout": 5.0}
    assert repr(WeightSyncScheme.from_config(scheme.to_config())) == repr(scheme)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        RayWeightSyncScheme(timeout=0)


def _message(body: Any, version: int = 1) -> Message:
    return Message(b"", "weights", 7, body, {"model_id": "policy", "version": version}, True)


def _body(model: nn.Module, **changes: Any) -> dict[str, Any]:
    layout = FlatLayout.of(dict(model.state_dict()))
    return {"store": "asyncrl-weights-policy-0", "namespace": "ns", "version": 1,
            "nbytes": layout.nbytes, "layout": layout.describe(), **changes}


@pytest.mark.parametrize(("changes", "error", "words"), [
    ({"store": "someone-elses-actor"}, ProtocolError, "asyncrl-weights-"),
    ({"version": "1"}, ProtocolError, "'version': int >= 1"),
    ({"namespace": "x" * 1000}, ProtocolError, "'namespace': str"),
    ({"nbytes": 1 << 40}, ProtocolError, "bytes for a layout of"),
    ({"version": 2}, ProtocolError, "say version 2, their message 1"),
])
def test_a_malformed_message_is_acked_with_an_error_and_never_reaches_ray(
        changes: dict[str, Any], error: type[Exception], words: str) -> None:
    policy = nn.Linear(3, 2)
    receiver = RayWeightSyncScheme().init_on_worker("policy", model=policy)
    receiver.on_message(_message(_body(policy, **changes)))
    [ack] = receiver.take_acks()
    assert isinstance(ack.error, error) and words in str(ack.error), ack.error
    assert receiver.version == 0 and not receiver.has_pending


def test_weights_of_another_architecture_are_refused_naming_what_differs() -> None:
    receiver = RayWeightSyncScheme().init_on_worker("policy", model=nn.Linear(3, 2))
    receiver.on_message(_message(_body(nn.Linear(4, 2))))
    [ack] = receiver.take_acks()
    assert isinstance(ack.error, WeightSyncError)
    assert "weight: trainer ('float32', (2, 4)), worker ('float32', (2, 3))" in str(ack.error)


class FakeCollector:
    """What RayWeightUpdater uses of a collector: its sender and update_policy_weights."""

    def __init__(self, workers: dict[int, bytes]) -> None:
        self.sender = RayWeightSender("policy", None, workers=workers)
        self.updates: list[tuple[Any, Any]] = []

    def weight_sender(self, model_id: str = "policy") -> Any:
        return self.sender

    async def update_policy_weights(self, weights: Any = None, *, worker_ids: Any = None) -> None:
        self.updates.append((weights, worker_ids))


@pytest.mark.anyio
async def test_max_interval_counts_calls_per_collector_as_torchrl_does() -> None:
    a, b = FakeCollector({0: b"a"}), FakeCollector({0: b"b"})
    updater = RayWeightUpdater("w0", [a, b], max_interval=1)
    assert updater.all_worker_ids() == [0, 1]
    await updater()                      # each skipped once: count 1 <= 1
    assert a.updates == b.updates == []
    await updater("w1")                  # count 2 > 1: both updated
    await updater("w2", worker_ids=[1])  # b's count restarted: skipped
    await updater(worker_ids=1)          # now due, with policy_weights
    assert a.updates == [("w1", None)]
    assert b.updates == [("w1", None), ("w0", None)]


@pytest.mark.anyio
async def test_one_collector_is_updated_per_worker_id() -> None:
    collector = FakeCollector({0: b"a", 3: b"b"})
    updater = RayWeightUpdater("w", collector)
    assert updater.all_worker_ids() == [0, 3]
    await updater.update_weights(worker_ids=[3])
    assert collector.updates == [("w", [3])]
    with pytest.raises(ValueError, match=r"unknown worker id\(s\) \[5\]; known: \[0, 3\]"):
        await updater(worker_ids=5)


def test_a_collector_whose_weights_do_not_travel_by_ray_is_refused() -> None:
    class ZmqCollector:
        def weight_sender(self, model_id: str = "policy") -> Any:
            return object()

    with pytest.raises(ValueError, match="RayWeightSyncScheme"):
        RayWeightUpdater({}, [ZmqCollector()])
