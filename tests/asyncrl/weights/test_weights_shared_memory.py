"""Shared-memory weights: zero-copy apply, buffers never rewritten under a reader, live mode.

The in-memory hub stands in for the sockets (the socket tests in
``test_weights_zmq.py`` run both schemes over real ZeroMQ and a worker process).
"""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import torch
from torch import nn

from asyncrl.testing import fill_parameters, parameter_values
from asyncrl.weights import (
    LiveSharedMemWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightReceiver,
    WeightSender,
    WeightSyncScheme,
)
from transports import LocalHub, LocalLink

pytestmark = pytest.mark.anyio
WAIT = 20


def net(fill: float, *, norm: bool = False) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)]
    if norm:
        layers.append(nn.BatchNorm1d(2))
    module = nn.Sequential(*layers)
    fill_parameters(module, fill)
    return module


def addresses(module: nn.Module) -> list[int]:
    return [p.data_ptr() for p in module.parameters()]


class Worker:
    """One worker's weight path in a task; ``gate`` closed = a worker stuck in a long step."""

    def __init__(self, link: LocalLink, receiver: WeightReceiver) -> None:
        self.link, self.receiver = link, receiver
        self.gate = anyio.Event()
        self.gate.set()

    async def run(self) -> None:
        while True:
            message = await self.link.recv()
            await self.gate.wait()
            self.receiver.on_message(message)
            self.receiver.apply_pending()
            await self.receiver.flush_acks(self.link)


@asynccontextmanager
async def cluster(scheme: WeightSyncScheme, models: list[nn.Module], trainer: nn.Module
                  ) -> AsyncIterator[tuple[WeightSender, list[Worker]]]:
    hub = LocalHub(encode=True)
    peers = {i: f"w{i}".encode() for i in range(len(models))}
    sender = scheme.init_on_sender("policy", hub=hub, model=trainer, workers=peers)
    workers = []
    for i, model in enumerate(models):
        receiver = pickle.loads(pickle.dumps(scheme)).init_on_worker("policy", model=model)
        workers.append(Worker(hub.connect(peers[i]), receiver))
    async with anyio.create_task_group() as tg:
        for worker in workers:
            tg.start_soon(worker.run)
        try:
            yield sender, workers
        finally:
            tg.cancel_scope.cancel()
            for worker in workers:
                worker.receiver.close()
            await sender.aclose()


async def test_workers_step_with_views_of_the_buffer_no_copy() -> None:
    models = [net(0.0), net(0.0)]
    own = [addresses(m) for m in models]
    with anyio.fail_after(WAIT):
        async with cluster(SharedMemWeightSyncScheme(), models, net(1.0)) as (sender, workers):
            assert await sender.send() == 1
            for model, worker, before in zip(models, workers, own, strict=True):
                block = worker.receiver.block  # type: ignore[attr-defined]
                views = block.slot_views(0)
                assert [views[k].data_ptr() for k, _ in model.named_parameters()] \
                    == addresses(model) != before
                assert parameter_values(model) == {1.0}
            assert sender.pool_size == 1
            # blocking sends alternate between two buffers: each write goes to the free one
            for fill in (2.0, 3.0, 4.0):
                fill_parameters(sender.model, fill)
                await sender.send()
                assert [parameter_values(m) for m in models] == [{fill}, {fill}]
            assert sender.pool_size == 2


async def test_a_lagging_worker_keeps_its_weights_whole_while_the_others_move_on() -> None:
    models = [net(0.0), net(0.0)]
    trainer = net(1.0)
    scheme = SharedMemWeightSyncScheme(slots=3, slot_timeout=0.05)
    with anyio.fail_after(WAIT):
        async with cluster(scheme, models, trainer) as (sender, workers):
            await sender.send()
            workers[1].gate = anyio.Event()  # worker 1 is stuck in a long step, on version 1
            for version in range(2, 12):
                fill_parameters(trainer, float(version))
                assert await sender.send_async() == version
                # worker 0 keeps up (its acks free buffers); worker 1 must see version 1
                while workers[0].receiver.version < version:
                    await anyio.sleep(0.001)
                assert parameter_values(models[1]) == {1.0}
                assert parameter_values(models[0]) == {float(version)}
            # worker 1 pins version 1 and has 2 in transit; 11 is the latest: the pool grew
            # past its 3 buffers instead of rewriting one worker 1 may read
            assert 3 <= sender.pool_size <= 5
            workers[1].gate.set()
            assert (await sender.wait_ack(timeout=WAIT))[1] == 11
            assert parameter_values(models[1]) == {11.0}
            fill_parameters(trainer, 12.0)
            await sender.send()
            assert sender.pool_size <= 3  # spare buffers unlinked once nobody reads them


async def test_buffers_are_copied_and_parameters_shared() -> None:
    model, trainer = net(0.0, norm=True), net(1.0, norm=True)
    with torch.no_grad():
        trainer[3].running_mean.fill_(5.0)
    with anyio.fail_after(WAIT):
        async with cluster(SharedMemWeightSyncScheme(), [model], trainer) as (sender, workers):
            await sender.send()
            views = workers[0].receiver.block.slot_views(0)  # type: ignore[attr-defined]
            mean = model[3].running_mean
            assert mean.data_ptr() != views["3.running_mean"].data_ptr()
            assert mean.tolist() == [5.0, 5.0]
            assert model[3].weight.data_ptr() == views["3.weight"].data_ptr()
            mean.add_(1.0)  # the worker's own statistics: the trainer's buffer is untouched
            assert views["3.running_mean"].tolist() == [5.0, 5.0]


async def test_zero_copy_off_copies_into_the_workers_own_tensors() -> None:
    model = net(0.0)
    before = addresses(model)
    scheme = SharedMemWeightSyncScheme(zero_copy=False)
    assert WeightSyncScheme.from_config(scheme.to_config()).zero_copy is False  # type: ignore[attr-defined]
    with anyio.fail_after(WAIT):
        async with cluster(scheme, [model], net(2.0)) as (sender, _workers):
            await sender.send()
            assert addresses(model) == before and parameter_values(model) == {2.0}


async def test_live_scheme_trains_in_place_and_sends_only_a_version() -> None:
    trainer, model = net(1.0), net(0.0)
    parameters = list(trainer.parameters())
    optimizer = torch.optim.SGD(trainer.parameters(), lr=1.0)
    scheme = LiveSharedMemWeightSyncScheme()
    assert repr(WeightSyncScheme.from_config(scheme.to_config())) == repr(scheme)
    with anyio.fail_after(WAIT):
        async with cluster(scheme, [model], trainer) as (sender, _workers):
            block = sender.block  # type: ignore[attr-defined]
            views = block.slot_views(0)
            assert list(trainer.parameters()) == parameters  # same objects: the optimiser works
            assert [views[k].data_ptr() for k, _ in trainer.named_parameters()] \
                == addresses(trainer)
            assert await sender.send() == 1
            assert parameter_values(model) == {1.0}
            # an optimiser step reaches the worker at once, without a send (the weaker guarantee)
            trainer(torch.ones(3, 4)).sum().backward()
            optimizer.step()
            assert parameter_values(model) == parameter_values(trainer) != {1.0}
            assert await sender.send() == 2
            with pytest.raises(ValueError, match="own parameters"):
                await sender.send(net(3.0))
        # closed: the trainer's model is back in private memory, values kept
        assert parameter_values(trainer) == parameter_values(model)
        assert all(views[k].data_ptr() != p.data_ptr() for k, p in trainer.named_parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_live_scheme_refuses_a_gpu_model() -> None:
    scheme = LiveSharedMemWeightSyncScheme()
    with pytest.raises(ValueError, match="on the CPU"):
        scheme.init_on_sender("policy", hub=LocalHub(), model=net(1.0).cuda(), workers={})


# ------------------------------------------------------------------ collectors, exact versions


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_frames_keep_exact_versions_under_zero_copy_shared_memory(sync: bool) -> None:
    from asyncrl import MultiCollector
    from asyncrl.testing import CountingEnv, ValuePolicy, collect_with_updates, version_problems

    policy = ValuePolicy(0.0)
    with anyio.fail_after(120):  # two worker processes on a loaded machine: not a speed bound
        async with MultiCollector([CountingEnv] * 2, policy, sync=sync, frames_per_batch=16,
                                  total_frames=16 * 14,
                                  weight_sync_schemes={"policy": SharedMemWeightSyncScheme()},
                                  ) as collector:
            # async: pipelined sends, newest wins, buffers rotate
            batches, values = await collect_with_updates(collector, policy, sync=sync)
    assert version_problems(batches, values) == []
    seen = {int(v) for b in batches for v in b["collector", "policy_version"].reshape(-1)}
    assert len(seen) >= 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_cuda_learner_dmas_into_the_buffers_and_versions_stay_exact(sync: bool) -> None:
    from asyncrl import MultiCollector
    from asyncrl.testing import CountingEnv, ValuePolicy, collect_with_updates, version_problems

    policy = ValuePolicy(0.0).cuda()  # the learner's model on the GPU, CPU workers
    with anyio.fail_after(120):
        async with MultiCollector([CountingEnv] * 2, policy, sync=sync, frames_per_batch=16,
                                  total_frames=16 * 10, policy_device="cpu",
                                  weight_sync_schemes={"policy": SharedMemWeightSyncScheme()},
                                  ) as collector:
            batches, values = await collect_with_updates(collector, policy, sync=sync)
            # The buffers were registered with CUDA: the device copies went straight in.
            buffers = collector.weight_sender()._buffers  # type: ignore[attr-defined]
            assert all(b.pinned_at is not None for b in buffers)
    assert version_problems(batches, values) == []


# The live scheme in a collector: tests/asyncrl/weights/test_weights_live.py (exact stamps
# in sync mode, lower bounds in async mode).
