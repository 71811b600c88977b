"""Live shared memory after the first update: a send publishes a version word, no message.

A worker attaches to the trainer's live block through one message (applied,
acked, the ack saying it reads the block's version word). Every later send to
it writes that word and is acknowledged at once; the worker stamps its frames
from the word at its next step boundary and copies the buffers there. Over the
in-memory hub with a fake rollout (messages counted), then real worker
processes in a collector.
"""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import torch
from torch import nn

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl.testing import CountingEnv, ValuePolicy, fill_parameters, parameter_values
from asyncrl.weights import (
    LiveSharedMemWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightApplier,
    WeightSender,
    WeightSyncScheme,
)
from tests.asyncrl.weights.test_weights_shared_memory import net
from transports import LocalHub, Message

pytestmark = pytest.mark.anyio
WAIT = 20


class FakeRollout:
    """The applier's rollout: a step hook, and the version it stamps on frames."""

    def __init__(self) -> None:
        self.before_step: Any = None
        self.policy_version = 0

    async def step(self) -> int:
        """One step boundary in a thread (as the rollout's); the version its frame gets."""
        if self.before_step is not None:
            await anyio.to_thread.run_sync(self.before_step)
        return self.policy_version


class Worker:
    """One worker's weight side over a LocalHub: an applier, a fake rollout, its messages."""

    def __init__(self, hub: LocalHub, peer: bytes, model: nn.Module,
                 scheme: WeightSyncScheme) -> None:
        self.peer, self.model = peer, model
        self.messages: list[Message] = []
        self.answers = True  # False: a worker that died or hangs (nothing applied, no ack)
        self.applier = WeightApplier(hub.connect(peer, deliver=self._deliver))
        self.applier.add(pickle.loads(pickle.dumps(scheme)).init_on_worker("policy",
                                                                           model=model))
        self.rollout = FakeRollout()
        self.applier.attach(self.rollout)

    def _deliver(self, message: Message) -> None:
        self.messages.append(message)
        if self.answers:
            self.applier.deliver(message)  # idle: applied at once, acked by send_acks


@asynccontextmanager
async def cluster(trainer: nn.Module, models: list[nn.Module],
                  scheme: WeightSyncScheme | None = None
                  ) -> AsyncIterator[tuple[WeightSender, list[Worker]]]:
    scheme = scheme or LiveSharedMemWeightSyncScheme()
    hub = LocalHub(encode=True)
    workers = [Worker(hub, f"w{i}".encode(), m, scheme) for i, m in enumerate(models)]
    sender = LiveSharedMemWeightSyncScheme().init_on_sender(
        "policy", hub=hub, model=trainer, workers={i: w.peer for i, w in enumerate(workers)})
    async with anyio.create_task_group() as tg:
        for worker in workers:
            tg.start_soon(worker.applier.send_acks)
        try:
            yield sender, workers
        finally:
            tg.cancel_scope.cancel()
            for worker in workers:
                worker.applier.close()
                await worker.applier.receivers.aclose()
            await sender.aclose()


async def test_after_the_first_update_a_send_sends_no_message_and_steps_stamp_it() -> None:
    trainer, models = net(1.0), [net(0.0), net(0.0)]
    with anyio.fail_after(WAIT):
        async with cluster(trainer, models) as (sender, workers):
            assert await sender.send() == 1  # the attach: one message each, applied, acked
            assert [len(w.messages) for w in workers] == [1, 1]
            assert sender.attached == [0, 1]  # type: ignore[attr-defined]
            assert [await w.rollout.step() for w in workers] == [1, 1]
            for version in (2, 3, 4):
                assert await sender.send_async() == version
                assert await sender.wait_ack() == {0: version, 1: version}
            # No message, nothing waiting, nothing queued: the acks were complete at once.
            assert [len(w.messages) for w in workers] == [1, 1]
            assert sender.copies_sent == 2 and sender.outstanding == 0
            assert all(lane.queued is None for lane in sender._lanes.values())
            # Idle workers still report the version of their last step until they step...
            assert [w.rollout.policy_version for w in workers] == [1, 1]
            # ...and every step started after the send returned is stamped with it.
            assert [await w.rollout.step() for w in workers] == [4, 4]
            assert [w.applier.policy_version for w in workers] == [4, 4]
            assert sender.acked_versions == {0: 4, 1: 4}
            fill_parameters(trainer, 5.0)  # live: the optimiser's writes are there already
            assert [parameter_values(m) for m in models] == [{5.0}, {5.0}]


async def test_buffers_are_copied_at_the_step_that_sees_a_new_version() -> None:
    trainer, model = net(1.0, norm=True), net(0.0, norm=True)
    with anyio.fail_after(WAIT):
        async with cluster(trainer, [model]) as (sender, (worker,)):
            await sender.send()
            mean = model[3].running_mean
            with torch.no_grad():
                trainer[3].running_mean.fill_(7.0)  # e.g. a forward pass in train mode
            await sender.send()
            assert len(worker.messages) == 1  # published, not sent
            assert mean.tolist() == [0.0, 0.0]  # not before the worker's next step
            assert await worker.rollout.step() == 2
            assert model[3].running_mean.tolist() == [7.0, 7.0]
            # Copied into the worker's own buffer: its statistics never write the trainer's.
            assert model[3].running_mean.data_ptr() != trainer[3].running_mean.data_ptr()
            model[3].running_mean.add_(1.0)
            assert trainer[3].running_mean.tolist() == [7.0, 7.0]
            # Parameters are the trainer's own memory; steps without a new version copy nothing.
            fill_parameters(trainer, 3.0)
            assert parameter_values(model) == {3.0}
            assert await worker.rollout.step() == 2
            assert model[3].running_mean.tolist() == [8.0, 8.0]


async def test_a_dead_or_stuck_attached_worker_does_not_hold_up_a_send() -> None:
    trainer, models = net(1.0), [net(0.0), net(0.0)]
    with anyio.fail_after(WAIT):
        async with cluster(trainer, models) as (sender, workers):
            await sender.send()
            workers[1].answers = False  # its process died (unnoticed yet), or hangs
            # Every wait in here is bounded by fail_after: a send that waited for worker
            # 1's ack would never return.
            assert await sender.send() == 2
            assert await sender.wait_ack() == {}
            assert await workers[0].rollout.step() == 2
            sender.remove_worker(1)  # the scheduler notices: nothing of it is kept
            assert 1 not in sender._attach  # type: ignore[attr-defined]
            assert await sender.send() == 3
            assert sender.outstanding == 0


async def test_a_worker_that_rejoins_or_is_replaced_attaches_by_message_again() -> None:
    trainer, models = net(1.0), [net(0.0), net(0.0)]
    with anyio.fail_after(WAIT):
        async with cluster(trainer, models) as (sender, workers):
            await sender.send()
            await sender.send()
            assert [len(w.messages) for w in workers] == [1, 1]
            # Worker 1 restarted with its old identity: the coordinator catches it up.
            assert await sender.on_worker_joined(1) == 2
            await sender.wait_ack()
            assert [len(w.messages) for w in workers] == [1, 2]
            await sender.send()  # attached again: published only
            assert [len(w.messages) for w in workers] == [1, 2]
            # A new incarnation under another identity: a message, whatever its index did.
            hub = sender.hub
            fresh = Worker(hub, b"w1-again", models[1], LiveSharedMemWeightSyncScheme())
            async with anyio.create_task_group() as tg:
                tg.start_soon(fresh.applier.send_acks)
                sender.add_worker(1, fresh.peer)
                await sender.send_latest(1)
                assert await sender.wait_ack() == {1: 3}
                assert len(fresh.messages) == 1
                assert await sender.send() == 4
                assert len(fresh.messages) == 1 and sender.attached == [0, 1]  # type: ignore[attr-defined]
                assert await fresh.rollout.step() == 4
                tg.cancel_scope.cancel()
            fresh.applier.close()


async def test_a_version_queued_before_the_worker_attached_is_answered_by_the_next() -> None:
    trainer, (model,) = net(1.0), [net(0.0)]
    with anyio.fail_after(WAIT):
        async with cluster(trainer, [model]) as (sender, (worker,)):
            worker.answers = False  # the attach message is in transit
            await sender.send_async()
            await sender.send_async()  # queued behind it (newest wins)
            assert len(worker.messages) == 1 and sender.outstanding == 2
            worker.answers = True
            worker.applier.deliver(worker.messages[0])  # it arrives, is applied and acked
            while not sender.attached:  # type: ignore[attr-defined]
                await anyio.sleep(0.001)
            assert await sender.send_async() == 3
            # Version 2 was never transmitted: version 3's publication answers it too.
            assert await sender.wait_ack() == {0: 3}
            assert len(worker.messages) == 1 and sender.outstanding == 0
            assert await worker.rollout.step() == 3


async def test_a_receiver_that_does_not_read_the_word_keeps_getting_messages() -> None:
    # A worker given the safe scheme (or an older asyncrl) does not say it reads the
    # word: the live sender goes on sending it messages rather than let its version stall.
    trainer, model = net(1.0), net(0.0)
    with anyio.fail_after(WAIT):
        async with cluster(trainer, [model], SharedMemWeightSyncScheme()) as (sender,
                                                                                (worker,)):
            for version in (1, 2, 3):
                assert await sender.send() == version
            assert len(worker.messages) == 3 and sender.attached == []  # type: ignore[attr-defined]
            assert worker.applier.policy_version == 3


async def test_a_new_coordinator_instance_is_not_read_from_the_old_block() -> None:
    trainer, model = net(1.0), net(0.0)
    with anyio.fail_after(WAIT):
        async with cluster(trainer, [model]) as (sender, (worker,)):
            worker.applier.follow("first")
            await sender.send()
            await sender.send()
            assert await worker.rollout.step() == 2
            worker.applier.follow("second")  # the trainer restarted: versions count afresh
            await sender.send()  # the old trainer's word moves (its block is still mapped)
            assert not worker.applier.receivers.has_pending
            assert await worker.rollout.step() == 2  # (a worker re-attaches its rollout)
            assert worker.applier.policy_version == 0


async def test_control_operations_see_the_published_version_while_idle() -> None:
    trainer, model = net(1.0), net(0.0)
    with anyio.fail_after(WAIT):
        async with cluster(trainer, [model]) as (sender, (worker,)):
            await sender.send()
            await sender.send()
            assert len(worker.messages) == 1
            await worker.applier.model_whole()  # what state_dict / getattr_policy run first
            assert worker.applier.policy_version == 2 == worker.rollout.policy_version


# ------------------------------------------------------------------ real worker processes


def live_collector(kind: Any, policy: nn.Module, batches: int) -> Any:
    """``kind`` (a multi-process collector class): 2 CountingEnv workers, the live scheme."""
    return kind([CountingEnv] * 2, policy, frames_per_batch=16, total_frames=16 * batches,
                weight_sync_schemes={"policy": LiveSharedMemWeightSyncScheme()})


async def test_collector_workers_stamp_every_frame_after_a_send_with_its_version() -> None:
    policy = ValuePolicy(0.0)
    stamped: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    with anyio.fail_after(120):  # two worker processes on a loaded machine: not a speed bound
        async with live_collector(MultiSyncCollector, policy, 8) as collector:
            sender = collector.weight_sender()
            async for batch in collector:
                stamped.append((sender.version, batch["collector", "policy_version"],
                                batch["action"]))
                fill_parameters(policy, float(sender.version + 1))
                await collector.update_policy_weights()
            # Two messages: each worker's attach. Every later update was published only.
            assert sender.copies_sent == 2
            assert sender.attached == [0, 1]  # type: ignore[attr-defined]
    assert len(stamped) == 8
    for version, versions, actions in stamped:
        # Sync mode: idle workers resumed after the send returned; each frame's step
        # started after it, hence read the word: stamped exactly with that version.
        assert (versions == version).all(), (version, versions)
        assert (actions >= version).all()  # the weights that acted: that version or newer


async def test_async_collector_workers_pick_up_published_versions_mid_run() -> None:
    policy = ValuePolicy(0.0)
    batches = []
    with anyio.fail_after(120):
        async with live_collector(MultiAsyncCollector, policy, 12) as collector:
            sender = collector.weight_sender()
            async for batch in collector:
                batches.append(batch)
                fill_parameters(policy, float(sender.version + 1))
                await sender.send_async()  # pipelined while the workers step
            await sender.wait_ack()
            assert sender.copies_sent == 2 and sender.outstanding == 0
    seen = set()
    for batch in batches:
        versions = batch["collector", "policy_version"]  # [envs, steps]
        # Read at step boundaries, mid-batch too: never backwards along a batch, and a
        # lower bound of the weights that acted.
        assert (versions[..., 1:] >= versions[..., :-1]).all()
        assert (batch["action"] >= versions).all()
        seen.update(int(v) for v in versions.reshape(-1))
    assert max(seen) >= 3  # published versions reached running workers without a message
