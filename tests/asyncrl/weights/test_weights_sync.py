"""Sender and receiver logic over the in-memory transport (every body goes through the codec).

Covers versions, acks, newest-wins pipelining, targeted and unknown workers,
timeouts naming the silent worker, remote failures, late joiners,
``max_interval``, post hooks, several model ids, the in-process and
no-sync schemes, and pickling of schemes. Real sockets: ``test_weights_zmq.py``.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import torch
from tensordict import TensorDict
from torch import nn

from asyncrl.testing import fill_parameters
from asyncrl.weights import (
    WEIGHTS_KIND,
    InProcessWeightSyncScheme,
    NotInitializedError,
    NoWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightReceiver,
    WeightReceiverGroup,
    WeightSender,
    WeightSyncError,
    WeightSyncScheme,
    ZmqWeightSyncScheme,
)
from transports import LocalHub, LocalLink, Message, PeerLostError, RemoteError

pytestmark = pytest.mark.anyio
WAIT = 10


def net(fill: float | None = None, width: int = 3) -> nn.Module:
    module = nn.Sequential(nn.Linear(2, width), nn.Tanh(), nn.Linear(width, 1))
    if fill is not None:
        fill_parameters(module, fill)
    return module



def value_of(module: nn.Module) -> float:
    """The single value all parameters hold (fails if they differ)."""
    values = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    assert bool((values == values[0]).all()), f"mixed weights: {values.unique()}"
    return float(values[0])


async def until(predicate: Any) -> None:
    """Poll ``predicate()`` until true (bounded by the caller's ``fail_after``)."""
    while not predicate():
        await anyio.sleep(0.001)


class FakeWorker:
    """A worker's weight path over a LocalLink: recv, on_message, apply, flush acks."""

    def __init__(self, hub: LocalHub, worker_id: int, models: dict[str, nn.Module],
                 scheme: WeightSyncScheme | None = None) -> None:
        self.peer = f"worker-{worker_id}".encode()
        self.link: LocalLink = hub.connect(self.peer)
        self.models = models
        self.applied: list[tuple[str, int]] = []
        receivers = []
        for model_id, model in models.items():
            scheme_ = pickle.loads(pickle.dumps(scheme or ZmqWeightSyncScheme()))
            receivers.append(scheme_.init_on_worker(model_id, model=model))
        self.group = WeightReceiverGroup(
            receivers, on_apply=lambda mid, v: self.applied.append((mid, v)))
        self.paused = False

    async def serve(self) -> None:
        while True:
            message = await self.link.recv()
            assert self.group.handles(message)
            self.group.on_message(message)
            if not self.paused:
                self.group.apply_pending()
                await self.group.flush_acks(self.link)


@asynccontextmanager
async def cluster(n: int, *, scheme: WeightSyncScheme | None = None,
                  models: Any = None) -> AsyncIterator[tuple[LocalHub, WeightSender,
                                                             list[FakeWorker], nn.Module]]:
    scheme = scheme or ZmqWeightSyncScheme()
    hub = LocalHub(encode=True)
    trainer_model = net(1.0)
    workers = [FakeWorker(hub, i, {"policy": net(0.0)} if models is None else models(i), scheme)
               for i in range(n)]
    sender = scheme.init_on_sender("policy", hub=hub, model=trainer_model,
                                   workers={i: w.peer for i, w in enumerate(workers)})
    async with anyio.create_task_group() as tg:
        for worker in workers:
            tg.start_soon(worker.serve)
        try:
            yield hub, sender, workers, trainer_model
        finally:
            tg.cancel_scope.cancel()
            await scheme.aclose()


# ------------------------------------------------------------------ basics


@pytest.mark.parametrize("strategy", ["tensordict", "state_dict"])
@pytest.mark.parametrize("scheme_cls", [ZmqWeightSyncScheme, SharedMemWeightSyncScheme])
async def test_send_applies_on_every_worker_and_acks_carry_the_version(
        strategy: str, scheme_cls: type[WeightSyncScheme]) -> None:
    with anyio.fail_after(WAIT):
        async with cluster(2, scheme=scheme_cls(strategy)) as (_, sender, workers, model):
            assert sender.version == 0
            assert await sender.send() == 1
            assert [value_of(w.models["policy"]) for w in workers] == [1.0, 1.0]
            fill_parameters(model, 2.0)
            version = await sender.send_async()
            assert version == 2
            assert await sender.wait_ack(timeout=WAIT) == {0: 2, 1: 2}
            assert [w.group.versions for w in workers] == [{"policy": 2}] * 2
            assert sender.acked_versions == {0: 2, 1: 2}
            assert await sender.wait_ack() == {}  # nothing outstanding


async def test_weights_argument_accepts_module_tensordict_and_state_dict() -> None:
    with anyio.fail_after(WAIT):
        async with cluster(1) as (_, sender, workers, _model):
            for fill, make in [(3.0, lambda m: m),
                               (4.0, TensorDict.from_module),
                               (5.0, lambda m: m.state_dict())]:
                source = net(fill)
                await sender.send(make(source))
                assert value_of(workers[0].models["policy"]) == fill


async def test_send_async_snapshots_so_the_trainer_can_train_on() -> None:
    with anyio.fail_after(WAIT):
        async with cluster(1) as (_, sender, workers, model):
            workers[0].paused = True
            await sender.send_async()
            fill_parameters(model, 99.0)  # an optimizer step right after the send
            await until(lambda: workers[0].group["policy"].pending_version == 1)
            workers[0].group.apply_pending()
            await workers[0].group.flush_acks(workers[0].link)
            await sender.wait_ack(timeout=WAIT)
            assert value_of(workers[0].models["policy"]) == 1.0


async def test_targeted_worker_ids_and_unknown_ids() -> None:
    with anyio.fail_after(WAIT):
        async with cluster(3) as (_, sender, workers, _model):
            assert await sender.send(worker_ids=1) == 1
            assert [value_of(w.models["policy"]) for w in workers] == [0.0, 1.0, 0.0]
            await sender.send(worker_ids=[0, 2])
            assert [w.group.versions["policy"] for w in workers] == [2, 1, 2]
            with pytest.raises(ValueError, match=r"unknown worker id\(s\) \[7\].*\[0, 1, 2\]"):
                await sender.send(worker_ids=[0, 7])
            assert sender.version == 2  # a refused send does not consume a version


async def test_several_model_ids_resolved_as_paths_on_the_worker() -> None:
    class WorkerRoot:
        def __init__(self) -> None:
            self.policy = net(0.0)
            self.critic = nn.Module()
            self.critic.module = nn.ModuleList([nn.Identity(), net(0.0, width=5)])
            self.env = type("Env", (), {"transform": [net(0.0, width=7)]})()

    root = WorkerRoot()
    hub = LocalHub(encode=True)
    link = hub.connect(b"w0")
    schemes = {"policy": ZmqWeightSyncScheme(),
               "critic.module[1]": ZmqWeightSyncScheme("state_dict"),
               "env.transform[0]": SharedMemWeightSyncScheme()}
    trainer = {"policy": net(1.0), "critic.module[1]": net(2.0, width=5),
               "env.transform[0]": net(3.0, width=7)}
    senders = {mid: s.init_on_sender(mid, hub=hub, model=trainer[mid], workers={0: b"w0"})
               for mid, s in schemes.items()}
    worker_schemes = pickle.loads(pickle.dumps(schemes))
    group = WeightReceiverGroup(s.init_on_worker(mid, root=root)
                                for mid, s in worker_schemes.items())
    with anyio.fail_after(WAIT):
        for sender in senders.values():
            await sender.send_async()
        while (message := link.recv_nowait()) is not None:
            group.on_message(message)
        assert group.apply_pending() == {"policy": 1, "critic.module[1]": 1, "env.transform[0]": 1}
        assert await group.flush_acks(link) == 3
        for sender in senders.values():
            assert await sender.wait_ack(timeout=WAIT) == {0: 1}
    assert value_of(root.policy) == 1.0
    assert value_of(root.critic.module[1]) == 2.0
    assert value_of(root.env.transform[0]) == 3.0
    for scheme in schemes.values():
        await scheme.aclose()
    for scheme in worker_schemes.values():
        await scheme.aclose()


# ------------------------------------------------------------------ newest wins


@pytest.mark.parametrize("scheme_cls", [ZmqWeightSyncScheme, SharedMemWeightSyncScheme])
async def test_pipelined_sends_newest_wins_and_both_are_acked_with_it(
        scheme_cls: type[WeightSyncScheme]) -> None:
    with anyio.fail_after(WAIT):
        async with cluster(1, scheme=scheme_cls()) as (_, sender, workers, model):
            worker = workers[0]
            worker.paused = True  # the rollout is busy: nothing is applied yet
            await sender.send_async()  # version 1: in transit
            fill_parameters(model, 2.0)
            await sender.send_async()  # version 2: queued behind it, in the sender
            fill_parameters(model, 3.0)
            await sender.send_async()  # version 3 replaces 2, which is never sent
            await until(lambda: worker.group["policy"].pending_version == 1)
            assert sender.copies_sent == 1
            worker.paused = False
            worker.group.apply_pending()
            await worker.group.flush_acks(worker.link)
            # wait_ack sends version 3 once 1 is acked; sends 2 and 3 are acked with 3
            assert await sender.wait_ack(timeout=WAIT) == {0: 3}
            assert sender.copies_sent == 2
            versions = [v for _, v in worker.applied]
            assert versions[-1] == 3 and 2 not in versions  # version 2 was never applied
            assert value_of(worker.models["policy"]) == 3.0


async def test_older_or_equal_versions_are_acked_at_once_with_the_held_version() -> None:
    receiver = WeightReceiver("policy", net(0.0))
    weights = net(5.0).state_dict()

    def msg(seq: int, version: int) -> Message:
        return Message(b"", WEIGHTS_KIND, seq, weights, {"model_id": "policy", "version": version},
                       True)

    receiver.on_message(msg(1, 3))
    receiver.on_message(msg(2, 2))  # out of order: superseded by the pending 3
    assert receiver.apply_pending()
    receiver.on_message(msg(3, 3))  # a repeat (late-join catch-up racing a send)
    assert not receiver.apply_pending()
    assert [(a.message.seq, a.version) for a in receiver.take_acks()] == [(1, 3), (2, 3), (3, 3)]


async def test_rollout_thread_applies_while_the_loop_receives() -> None:
    """apply_pending in another thread, on_message in the loop: every ack >= its version."""
    model = net(0.0)
    receiver = WeightReceiver("policy", model)
    seen: list[float] = []
    stop = threading.Event()

    def rollout() -> None:
        while not stop.is_set():
            receiver.apply_pending()
            seen.append(value_of(model))  # a "step": never sees mixed weights

    thread = threading.Thread(target=rollout)
    thread.start()
    try:
        with anyio.fail_after(WAIT):
            for version in range(1, 201):
                receiver.on_message(Message(b"", WEIGHTS_KIND, version,
                                            net(float(version)).state_dict(),
                                            {"model_id": "policy", "version": version}, True))
                await anyio.lowlevel.checkpoint()
            await until(lambda: receiver.version == 200)
    finally:
        stop.set()
        thread.join()
    acks = receiver.take_acks()
    assert sorted(a.message.seq for a in acks) == list(range(1, 201))
    assert all(a.version is not None and a.version >= a.message.seq for a in acks)
    assert seen == sorted(seen)  # versions only go forward


# ------------------------------------------------------------------ failures


async def test_ack_timeout_names_the_silent_worker_and_keeps_waiting() -> None:
    with anyio.fail_after(WAIT):
        async with cluster(3) as (hub, sender, workers, _model):
            workers[1].paused = True  # alive but never acks
            await sender.send_async()
            with pytest.raises(TimeoutError, match=r"worker\(s\) \[1\] \(peers worker-1\)"):
                await sender.wait_ack(timeout=0.2)
            assert sender.outstanding == 1
            hub.lose(workers[1].peer)  # the worker is declared dead
            with pytest.raises(PeerLostError, match="worker-1") as info:
                await sender.wait_ack(timeout=WAIT)
            assert "worker(s) [0, 1, 2]" in "".join(info.value.__notes__)
            assert sender.outstanding == 0


async def test_remove_worker_fails_its_pending_acks() -> None:
    with anyio.fail_after(WAIT):
        async with cluster(2) as (_, sender, workers, _model):
            workers[0].paused = True
            await sender.send_async()
            sender.remove_worker(0)
            with pytest.raises(PeerLostError):
                await sender.wait_ack(timeout=WAIT)
            assert sorted(sender.workers) == [1]


@pytest.mark.parametrize("scheme_cls", [ZmqWeightSyncScheme, SharedMemWeightSyncScheme])
async def test_a_failed_apply_comes_back_as_remote_error(
        scheme_cls: type[WeightSyncScheme]) -> None:
    models = lambda i: {"policy": net(0.0, width=3 if i == 0 else 4)}  # noqa: E731
    with anyio.fail_after(WAIT):
        async with cluster(2, scheme=scheme_cls(), models=models) as (_, sender, workers, _m):
            with pytest.raises(RemoteError) as info:
                await sender.send(timeout=WAIT)
            err = info.value
            assert err.peer == "worker-1"
            assert err.remote_type == "asyncrl.weights._errors.WeightMismatchError"
            assert "wrongly shaped keys" in str(err) and "Traceback" in err.remote_traceback
            assert "version 1 of model 'policy'" in "".join(err.__notes__)
            assert workers[1].group.versions == {"policy": 0}  # nothing applied over there
            assert workers[0].group.versions == {"policy": 1}
            await sender.send(worker_ids=0)  # the sender keeps working
            assert workers[0].group.versions == {"policy": 2}


async def test_malformed_weight_messages_are_acked_with_an_error() -> None:
    group = WeightReceiverGroup([WeightReceiver("policy", net(0.0))])
    bad = [
        Message(b"", WEIGHTS_KIND, 1, {"w": 1}, {"model_id": "value", "version": 1}, True),
        Message(b"", WEIGHTS_KIND, 2, [1, 2], {"model_id": "policy", "version": 1}, True),
        Message(b"", WEIGHTS_KIND, 3, {}, {"model_id": "policy", "version": "1"}, True),
    ]
    for message in bad:
        group.on_message(message)
    acks = group.take_acks()
    assert [a.message.seq for a in acks] == [1, 2, 3]
    assert all(a.error is not None and a.result is None for a in acks)
    assert "no weight receiver for model 'value'" in str(acks[0].error)
    assert group.versions == {"policy": 0}


async def test_send_without_model_or_weights_is_a_clear_error() -> None:
    sender = ZmqWeightSyncScheme().init_on_sender("policy", hub=LocalHub(), workers={})
    with pytest.raises(ValueError, match="no model registered"):
        await sender.send_async()


# ------------------------------------------------------------------ late join, max_interval


@pytest.mark.parametrize("scheme_cls", [ZmqWeightSyncScheme, SharedMemWeightSyncScheme])
async def test_late_joiner_gets_the_latest_version_before_anything_else(
        scheme_cls: type[WeightSyncScheme]) -> None:
    with anyio.fail_after(WAIT):
        async with cluster(1, scheme=scheme_cls()) as (hub, sender, _workers, model):
            late = FakeWorker(hub, 5, {"policy": net(0.0)}, scheme_cls())
            await sender.send()
            fill_parameters(model, 2.0)
            await sender.send()
            sender.add_worker(5, late.peer)
            assert await sender.on_worker_joined(5) == 2
            message = late.link.recv_nowait()  # queued before any collect request would be
            assert message is not None and message.meta["version"] == 2
            late.group.on_message(message)
            late.group.apply_pending()
            await late.group.flush_acks(late.link)
            assert await sender.wait_ack(timeout=WAIT) == {5: 2}
            assert value_of(late.models["policy"]) == 2.0


async def test_nothing_to_catch_up_before_the_first_send() -> None:
    sender = ZmqWeightSyncScheme().init_on_sender("policy", hub=LocalHub(), model=net(),
                                                  workers={0: b"w0"})
    assert sender.latest() is None
    assert await sender.send_latest(0) is None


async def test_workers_may_be_a_callable_of_the_live_workers() -> None:
    hub = LocalHub(encode=True)
    live: dict[int, bytes] = {}
    sender = ZmqWeightSyncScheme().init_on_sender("policy", hub=hub, model=net(1.0),
                                                  workers=lambda: live)
    with anyio.fail_after(WAIT):
        assert await sender.send() == 1  # nobody yet: nothing to wait for
        worker = FakeWorker(hub, 0, {"policy": net(0.0)})
        live[0] = worker.peer
        assert await sender.on_worker_joined(0) == 1
        worker.group.on_message(worker.link.recv_nowait())  # type: ignore[arg-type]
        worker.group.apply_pending()
        await worker.group.flush_acks(worker.link)
        assert await sender.wait_ack(timeout=WAIT) == {0: 1}


async def test_max_interval_skips_workers_until_they_delivered_enough_batches() -> None:
    with anyio.fail_after(WAIT):
        async with cluster(2, scheme=ZmqWeightSyncScheme(max_interval=2)) as (_, sender, workers,
                                                                               _m):
            await sender.send()  # first update: everyone is due
            assert [w.group.versions["policy"] for w in workers] == [1, 1]
            sender.note_batch(0)
            sender.note_batch(1, 2)
            assert await sender.send() == 2  # worker 0 delivered 1 batch only: skipped
            assert [w.group.versions["policy"] for w in workers] == [1, 2]
            sender.note_batch(0)
            await sender.send()
            assert [w.group.versions["policy"] for w in workers] == [3, 2]


async def test_post_hooks_run_after_each_send() -> None:
    calls: list[int] = []
    with anyio.fail_after(WAIT):
        async with cluster(1) as (_, sender, _workers, _model):
            sender.register_post_hook(lambda: calls.append(sender.version))
            await sender.send()
            await sender.send_async()
            await sender.wait_ack(timeout=WAIT)
    assert calls == [1, 2]


# ------------------------------------------------------------------ schemes


@pytest.mark.parametrize("scheme", [
    ZmqWeightSyncScheme("state_dict", max_interval=3),
    SharedMemWeightSyncScheme(slots=3, slot_timeout=5.0),
    NoWeightSyncScheme(),
])
async def test_schemes_pickle_without_runtime_state(scheme: WeightSyncScheme) -> None:
    with pytest.raises(NotInitializedError, match="init_on_sender"):
        scheme.get_sender()
    with pytest.raises(NotInitializedError, match="init_on_worker"):
        scheme.get_receiver()
    scheme.init_on_sender("policy", hub=LocalHub(), model=net(), workers={0: b"w0"})
    scheme.init_on_worker("policy", model=net())
    clone = pickle.loads(pickle.dumps(scheme))
    assert type(clone) is type(scheme) and clone.strategy == scheme.strategy
    assert not clone.initialized_on_sender and not clone.initialized_on_worker
    with pytest.raises(NotInitializedError):
        clone.get_sender()
    assert repr(WeightSyncScheme.from_config(scheme.to_config())) == repr(scheme)
    await scheme.aclose()


def test_unknown_scheme_config_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown weight sync scheme"):
        WeightSyncScheme.from_config({"scheme": "carrier-pigeon"})


async def test_no_weight_sync_refuses_to_send_instead_of_doing_nothing() -> None:
    scheme = NoWeightSyncScheme()
    sender = scheme.init_on_sender("policy", hub=LocalHub(), model=net(), workers={0: b"w0"})
    with pytest.raises(WeightSyncError, match="never sent"):
        await sender.send()
    assert await sender.on_worker_joined(0) is None
    receiver = NoWeightSyncScheme().init_on_worker("policy")
    receiver.on_message(Message(b"", WEIGHTS_KIND, 1, {}, {"model_id": "policy", "version": 1},
                                True))
    [ack] = receiver.take_acks()
    assert isinstance(ack.error, WeightSyncError)


async def test_in_process_scheme_shares_the_object_without_copying() -> None:
    policy = net(1.0)
    scheme = InProcessWeightSyncScheme()
    sender = scheme.init_on_sender("policy", model=policy)
    versions: list[int] = []
    receiver = scheme.init_on_worker("policy", model=policy, on_apply=versions.append)
    ptr = policy[0].weight.data_ptr()
    with anyio.fail_after(WAIT):
        fill_parameters(policy, 2.0)
        await sender.send_async()
        assert receiver.pending_version == 1  # delivered synchronously, applied at the boundary
        assert receiver.apply_pending()
        assert await receiver.flush_acks() == 1
        assert await sender.wait_ack(timeout=WAIT) == {0: 1}
    assert versions == [1] and policy[0].weight.data_ptr() == ptr and value_of(policy) == 2.0
    await scheme.aclose()


async def test_in_process_scheme_copies_into_a_separate_object() -> None:
    trainer, collector = net(1.0), net(0.0)
    scheme = InProcessWeightSyncScheme()
    sender = scheme.init_on_sender("policy", model=trainer)
    receiver = scheme.init_on_worker("policy", model=collector)
    with anyio.fail_after(WAIT):
        await sender.send_async()
        fill_parameters(trainer, 7.0)  # the snapshot was taken at send time
        receiver.apply_pending()
        await receiver.flush_acks()
        await sender.wait_ack(timeout=WAIT)
    assert value_of(collector) == 1.0
    assert scheme.get_receiver(0) is receiver
    with pytest.raises(NotInitializedError):
        scheme.get_receiver(3)


def test_in_process_worker_before_sender_is_a_clear_error() -> None:
    with pytest.raises(NotInitializedError, match="init_on_sender"):
        InProcessWeightSyncScheme().init_on_worker("policy", model=net())
