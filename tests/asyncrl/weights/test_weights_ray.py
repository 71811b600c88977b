"""RayWeightSyncScheme and RayWeightUpdater without a Ray cluster: configuration, hostile
messages refused before Ray is asked anything, and TorchRL's ``max_interval`` counting.

The end-to-end runs on two raylets are in tests/multihost/test_ray_weights.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from asyncrl.weights import (
    RayWeightSender,
    RayWeightSyncScheme,
    RayWeightUpdater,
    WeightMismatchError,
    WeightStrategy,
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


@pytest.mark.parametrize(("trainer", "fields"), [
    (nn.Linear(4, 2), {"wrong_shape": [("weight", (2, 3), (2, 4))]}),
    (nn.Linear(3, 2).double(), {"wrong_dtype": [("bias", "float32", "float64"),
                                                ("weight", "float32", "float64")]}),
    (nn.Linear(3, 2, bias=False), {"missing": ["bias"]}),
    (nn.Sequential(nn.Linear(3, 2)), {"missing": ["bias", "weight"],
                                      "unexpected": ["0.bias", "0.weight"]}),
], ids=["shape", "dtype", "missing", "renamed"])
def test_weights_of_another_architecture_get_the_check_every_receiver_makes(
        trainer: nn.Module, fields: dict[str, Any]) -> None:
    """The same ``WeightMismatchError`` as ``WeightStrategy.apply_weights`` (the ZeroMQ,
    shared-memory and in-process receivers), dtypes included: Ray's bytes are not
    converted. Before, a bare ``WeightSyncError`` with the layouts' difference."""
    receiver = RayWeightSyncScheme().init_on_worker("policy", model=nn.Linear(3, 2))
    receiver.on_message(_message(_body(trainer)))
    [ack] = receiver.take_acks()
    assert isinstance(ack.error, WeightMismatchError), ack.error
    expected = {"missing": [], "unexpected": [], "wrong_shape": [], "wrong_dtype": [], **fields}
    assert {name: getattr(ack.error, name) for name in expected} == expected
    assert str(ack.error).startswith("the trainer's weights of 'policy' do not match the "
                                     "destination model; nothing was applied.")
    assert receiver.version == 0 and not receiver.has_pending
    if "wrong_dtype" not in fields:  # what the other receivers say of the same weights
        with pytest.raises(WeightMismatchError) as other:
            WeightStrategy().apply_weights(nn.Linear(3, 2), trainer.state_dict())
        assert (other.value.missing, other.value.unexpected, other.value.wrong_shape) == (
            ack.error.missing, ack.error.unexpected, ack.error.wrong_shape)


@pytest.mark.parametrize(("layout", "words"), [
    ("[" * 100_000, "must be JSON, got RecursionError"),
    ("nope", "must be JSON, got JSONDecodeError"),
    ('{"weight": "float32"}', "must be a list, got dict"),
    ("[[1, 2, 3]]", "entry must be [key"),
    ('[["weight", "float32", [2, -3]]]', "entry must be [key"),
    ('[["weight", "float32", [2, 1152921504606846976]]]', "entry must be [key"),
    ('[["weight", "float32", [2, 3.0]]]', "entry must be [key"),
    ('[["weight", "float32", [2, true]]]', "entry must be [key"),
    ('[["weight", "float32", ' + str([1] * 65) + "]]", "entry must be [key"),
    ('[["weight", "_inductor", [2, 3]]]', "entry must be [key"),
    ('[["weight", "float32", [2, 3], "extra"]]', "entry must be [key"),
    ('[["' + "k" * 1025 + '", "float32", [2]]]', "entry must be [key"),
    ('[["bias", "float32", [2]], ["bias", "float32", [2]]]', "names 'bias' twice"),
], ids=["deep", "not-json", "dict", "not-strings", "negative-dim", "huge-dim", "float-dim",
        "bool-dim", "65-dims", "not-a-dtype", "four-fields", "long-key", "twice"])
def test_a_malformed_layout_is_a_protocol_error_before_ray_is_asked(
        layout: str, words: str) -> None:
    """Before, each was a ``WeightSyncError`` naming a difference (a deeply nested one, the
    ``RecursionError`` of ``json.loads``); the dtype name is checked against torch's dtypes,
    never looked up on ``torch`` (whose ``__getattr__`` imports some submodules)."""
    policy = nn.Linear(3, 2)
    receiver = RayWeightSyncScheme().init_on_worker("policy", model=policy)
    receiver.on_message(_message(_body(policy, layout=layout)))
    [ack] = receiver.take_acks()
    assert isinstance(ack.error, ProtocolError) and words in str(ack.error), ack.error
    assert receiver.version == 0 and not receiver.has_pending


def test_the_same_layout_written_otherwise_is_taken() -> None:
    policy = nn.Linear(3, 2)
    receiver = RayWeightSyncScheme().init_on_worker("policy", model=policy)
    spaced = json.dumps(list(reversed(json.loads(receiver.layout.describe()))), indent=1)
    assert receiver._check_body(_body(policy, layout=spaced)) == 1


class FakeRef:
    """Stands for a ``ray.ObjectRef``: what the fake Ray's ``get`` resolves."""

    def __init__(self, value: Any) -> None:
        self.value = value


class FakeRay:
    """The Ray calls a receiver makes, with a store whose answers the test sets: no cluster."""

    ObjectRef = FakeRef

    def __init__(self) -> None:
        self.answers: dict[int, Any] = {}  # version -> what the store's fetch returns
        self.store = SimpleNamespace(fetch=SimpleNamespace(
            remote=lambda version: FakeRef(self.answers.get(version))))

    def get_actor(self, name: str, namespace: str) -> Any:
        return self.store

    def get(self, ref: Any, timeout: float) -> Any:
        if not isinstance(ref, FakeRef):
            raise TypeError(f"not an ObjectRef: {type(ref).__name__}")
        return ref.value


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    fake = FakeRay()
    monkeypatch.setattr("asyncrl.weights._ray._ray", lambda *, connect=False: fake)
    return fake


def _flat(model: nn.Module) -> np.ndarray:
    """``model``'s weights as a sender ``ray.put``\\ s them: one flat uint8 buffer."""
    flat = {key: value.detach() for key, value in model.state_dict().items()}
    layout = FlatLayout.of(flat)
    buffer = layout.empty(torch.device("cpu"))
    for key, view in layout.views(buffer).items():
        view.copy_(flat[key])
    return buffer.numpy()


def _send(receiver: Any, fake: FakeRay, model: nn.Module, version: int, answer: Any) -> Any:
    """Version ``version`` of ``model``'s shape, the store answering ``answer``: the ack."""
    fake.answers[version] = answer
    receiver.on_message(_message(_body(model, version=version), version))
    receiver.apply_pending()
    [ack] = receiver.take_acks()
    return ack


def _filled(value: float) -> nn.Linear:
    model = nn.Linear(3, 2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)
    return model


def test_versions_only_go_forward_through_ray(fake_ray: FakeRay) -> None:
    """Held before the #43 changes too (the base receiver's rule): kept as a proof."""
    policy = _filled(0.0)
    receiver = RayWeightSyncScheme().init_on_worker("policy", model=policy)
    ack = _send(receiver, fake_ray, policy, 3, [FakeRef(_flat(_filled(3.0)))])
    assert (ack.error, ack.version, receiver.version, receiver.fetched) == (None, 3, 3, 1)
    for older in (2, 3):  # an older or the same version: acked with 3, never fetched
        ack = _send(receiver, fake_ray, policy, older, [FakeRef(_flat(_filled(9.0)))])
        assert (ack.error, ack.version, receiver.version, receiver.fetched) == (None, 3, 3, 1)
    assert torch.equal(policy.weight, torch.full((2, 3), 3.0))


@pytest.mark.parametrize(("answer", "words"), [
    ("not refs", "answered str 'not refs' for version 1 of 'policy', expected [ObjectRef]"),
    ([], "answered list [] for version 1"),
    ([object(), object()], "answered list"),
    (["a ref id"], "answered list ['a ref id'] for version 1"),
    ({"weight": 1}, "answered dict"),
], ids=["string", "empty", "two", "not-a-ref", "dict"])
def test_a_store_that_answers_anything_but_one_ref_is_refused(
        fake_ray: FakeRay, answer: Any, words: str) -> None:
    """Before: a ``WeightSyncError`` saying the fetch timed out ("within 60 s: IndexError")."""
    policy = _filled(1.0)
    receiver = RayWeightSyncScheme().init_on_worker("policy", model=policy)
    ack = _send(receiver, fake_ray, policy, 1, answer)
    assert isinstance(ack.error, ProtocolError) and words in str(ack.error), ack.error
    assert receiver.version == 0 and torch.equal(policy.weight, torch.ones(2, 3))


def _buffers() -> list[tuple[Any, str]]:
    right = _flat(_filled(2.0))
    return [
        ({"weight": torch.zeros(2, 3), "bias": "not a tensor"}, "a dict came"),
        (torch.from_numpy(right.copy()), "a Tensor came"),
        (right.view(np.float32), f"a float32 array of shape [{right.size // 4}] came"),
        (np.zeros(right.size + 1, np.uint8), f"a uint8 array of shape [{right.size + 1}] came"),
        (right.reshape(2, -1), f"a uint8 array of shape [2, {right.size // 2}] came"),
        (np.repeat(right, 2)[::2], f"a uint8 array of shape [{right.size}], not contiguous came"),
    ]


@pytest.mark.parametrize(("buffer", "words"), _buffers(),
                         ids=["state-dict-with-a-string", "tensor", "float32", "one-byte-more",
                              "2-d", "strided"])
def test_a_fetched_object_that_is_not_this_models_flat_buffer_is_refused(
        fake_ray: FakeRay, buffer: Any, words: str) -> None:
    """Held before for all but the strided array (a ``RuntimeError`` from ``view`` then,
    after a check that passed): each is now a ``ProtocolError`` naming what came."""
    policy = _filled(1.0)
    receiver = RayWeightSyncScheme().init_on_worker("policy", model=policy)
    ack = _send(receiver, fake_ray, policy, 1, [FakeRef(buffer)])
    assert isinstance(ack.error, ProtocolError), ack.error
    assert str(ack.error) == ("version 1 of 'policy' in Ray's object store is not a flat uint8 "
                              f"buffer of {receiver.layout.nbytes} bytes: {words}")
    assert receiver.version == 0 and torch.equal(policy.weight, torch.ones(2, 3))
    ack = _send(receiver, fake_ray, policy, 2, [FakeRef(_flat(_filled(2.0)))])  # then honest
    assert (ack.error, receiver.version) == (None, 2)
    assert torch.equal(policy.weight, torch.full((2, 3), 2.0))


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
