"""AsyncBatchedCollector: a dropped remote env worker's slot is taken again, and nothing leaks.

``remote_workers=K`` is K at a time: a killed host (lost by heartbeat) or one refused
for a bad message frees its slot for the next hello. The new occupant gets fresh
blocks, a fresh traj tag (its traj_ids never repeat the old one's), and never the
answer to a request its predecessor left in the inference loop; whatever the old
identity sends afterwards is a stranger's, refused.
"""

from __future__ import annotations

import anyio
import pytest
import torch
from tensordict import TensorDict
from torch import nn

from asyncrl import AsyncBatchedCollector
from asyncrl._inference.slot_occupants import MAX_TAG, SlotOccupants
from asyncrl.testing import CountingEnv, ValuePolicy, version_problems
from tests.asyncrl.inference.test_batched_remote_env_hosts import (
    hello,
    start_env_host,
    wait_exit,
)
from transports import Link, Message

pytestmark = pytest.mark.anyio
LIMIT = 120


def check_trajectories(frames: TensorDict, slots: int, length: int = 5) -> None:
    """Each traj_id is one CountingEnv episode, its steps in order, from one worker.

    Checked on the frames sorted by traj_id (stable, so each trajectory keeps its order)
    rather than one mask per trajectory: a loaded machine can pile up 50k frames here.
    """
    traj = frames["collector", "traj_ids"]
    order = torch.argsort(traj, stable=True)
    traj, obs = traj[order], frames["observation"][order]
    same = traj[1:] == traj[:-1]  # frame i + 1 continues frame i's trajectory
    # a traj_id used by two occupants would restart its steps (or mix episodes)
    broken = same & ((obs[1:, 0] != obs[:-1, 0] + 1) | (obs[1:, 1] != obs[:-1, 1]))
    assert not broken.any(), traj[1:][broken][:5].tolist()
    assert (frames["next", "observation"][:, 0] == frames["observation"][:, 0] + 1).all()
    assert torch.equal(frames["next", "terminated"],
                       (frames["next", "observation"][:, 0] == length).unsqueeze(-1))
    wrong = frames["collector", "worker_id"] != (frames["collector", "traj_ids"] >> 32) % slots
    assert not wrong.any(), frames["collector", "traj_ids"][wrong][:5].tolist()


@pytest.mark.parametrize("anyio_backend", ["trio"])  # end to end: one backend per test
async def test_a_killed_env_host_is_replaced_by_a_new_one_in_its_slot(anyio_backend: str) -> None:
    policy = ValuePolicy(1.0)
    batches: list[TensorDict] = []
    second = None
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=policy, frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1, heartbeat_interval=0.25,
                peer_timeout=1.5) as collector:
            first = start_env_host(collector.endpoint, 2, anyio_backend)
            try:
                async for batch in collector:
                    batches.append(batch)
                    if (batch["collector", "worker_id"] == 1).any():
                        break
            finally:
                first.kill()
                await wait_exit(first)
            while not collector.remote_refusals:  # lost after peer_timeout; local frames go on
                batches.append(await collector.__anext__())
            policy.value.data.fill_(0.0)
            await collector.update_policy_weights()  # the newcomer acts with version 1 only
            second = start_env_host(collector.endpoint, 2, anyio_backend)
            # slot 1's second occupant has traj tag 1 + 2 slots: ids 3 << 32 + 0, 1, ...
            wanted, seen = {(3 << 32) + 0, (3 << 32) + 1}, set()
            try:
                async for batch in collector:
                    batches.append(batch)
                    seen.update(batch["collector", "traj_ids"].tolist())
                    if wanted <= seen:
                        break
            finally:
                await collector.aclose()
                code, err = await wait_exit(second)
    assert code == 0, err
    [refusal] = collector.remote_refusals
    assert refusal.startswith("remote env worker ") and refusal.endswith(
        "(slot 1) lost: its connection closed (its process died)")
    assert all(tuple(b.batch_size) == (8,) for b in batches)  # every frame counted once
    frames = torch.cat(batches, 0)
    worker, traj = frames["collector", "worker_id"], frames["collector", "traj_ids"]
    assert set(worker.unique().tolist()) == {0, 1}
    assert set((traj[worker == 1] >> 32).unique().tolist()) == {1, 3}
    # each occupant's two envs start their own trajectories 0 and 1
    assert {(1 << 32) + 0, (1 << 32) + 1, (3 << 32) + 0, (3 << 32) + 1} <= set(traj.tolist())
    check_trajectories(frames, slots=2)
    assert version_problems(batches, {0: 1.0, 1: 0.0}) == []
    newcomer = frames[(traj >> 32) == 3]
    assert (newcomer["collector", "policy_version"] == 1).all()
    assert (newcomer["action"] == 0).all()


class EchoPolicy(nn.Module):
    """Action = the observation's first entry: an answer says which request it serves."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation[..., 0].round().to(torch.int64)


async def held_back(collector: AsyncBatchedCollector) -> None:
    """Until the trainer's buffer is full and the loop waits for room (no call for 0.5 s)."""
    while not collector._frames.full:
        await anyio.sleep(0.05)
    calls = -1
    while calls != collector.inference_statistics().calls:
        calls = collector.inference_statistics().calls
        await anyio.sleep(0.5)


async def take_until_answered(collector: AsyncBatchedCollector, link: Link,
                              taken: list[TensorDict]) -> Message:
    """What ``link`` hears next, taking batches (into ``taken``) until it does: one batch
    may not give the loop room again (chunks on their way when it was held back fill it
    up), and the local worker may fill it again before the loop serves ``link``."""
    while True:
        with anyio.move_on_after(0.5):
            return await link.recv()
        taken.append(await collector.__anext__())


def obs(value: float) -> dict[str, torch.Tensor]:
    return {"o0": torch.tensor([[value, 0.0]])}


def chunk_of(collector: AsyncBatchedCollector, steps: int, *, value: float,
             tag: int) -> TensorDict:
    chunk = TensorDict({}, batch_size=[1, steps])
    for path, (dtype, shape) in collector._env_hub.remote.schema(1).items():  # type: ignore[union-attr]
        chunk.set(path, torch.zeros(shape, dtype=dtype))
    chunk["observation"][..., 0] = value
    chunk["collector", "traj_ids"].fill_(tag << 32)
    return chunk


async def test_a_request_left_in_the_loop_is_answered_to_nobody_before_the_slot_is_reused(
        anyio_backend: str) -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=EchoPolicy(), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1) as collector:
            await held_back(collector)  # a slow trainer: requests wait in the loop
            async with Link(collector.endpoint, identity=b"old", heartbeat_interval=0.5) as old, \
                    Link(collector.endpoint, identity=b"new", heartbeat_interval=0.5) as new:
                await old.send(hello([2]), kind="hello")
                welcome = await old.recv()
                assert (welcome.body["slot"], welcome.body["traj_tag"]) == (1, 1)
                steps = welcome.body["chunk_steps"]
                await old.send(obs(111), kind="obs")
                await old.send(obs(112), kind="obs")  # breaks the agreement: dropped
                answer = await old.recv()
                assert answer.kind == "refuse"
                assert "sent a second request before its answer" in answer.body["reason"]

                # its slot still has a request in the loop: the newcomer waits for it
                await new.send(hello([2]), kind="hello")
                with anyio.move_on_after(1):
                    early = await new.recv()
                    pytest.fail(f"welcomed before the old request was answered: {early}")
                taken: list[TensorDict] = []  # room again: the loop answers nobody
                welcome = await take_until_answered(collector, new, taken)
                assert welcome.kind == "env_welcome"
                assert (welcome.body["slot"], welcome.body["traj_tag"]) == (1, 3)
                await new.send(obs(222), kind="obs")
                # its own answer first: not the old one's (111); once there is room
                answer = await take_until_answered(collector, new, taken)
                assert answer.kind == "act" and answer.body["a"]["action"].tolist() == [222]
                await new.send(chunk_of(collector, steps, value=333, tag=3), kind="chunk")

                # the old identity is a stranger now: refused, never in the loop or a batch
                await old.send(obs(444), kind="obs")
                await old.send(chunk_of(collector, steps, value=555, tag=1), kind="chunk")
                for kind in ("obs", "chunk"):
                    answer = await old.recv()
                    assert answer.kind == "refuse", answer
                    assert f"must first send 'hello' (role 'env'), got {kind!r}" \
                        in answer.body["reason"]

                while not any((b["collector", "worker_id"] == 1).any() for b in taken):
                    taken.append(await collector.__anext__())
                assert collector.remote_refusals == [
                    "remote env worker b'old' (slot 1) refused: sent a second request before "
                    "its answer",
                    "remote env worker b'old' refused: a remote env worker must first send "
                    "'hello' (role 'env'), got 'obs'",
                    "remote env worker b'old' refused: a remote env worker must first send "
                    "'hello' (role 'env'), got 'chunk'"]
    frames = torch.cat(taken, 0)
    remote = frames[frames["collector", "worker_id"] == 1]
    assert remote["observation"][:, 0].tolist() == [333.0] * steps
    assert ((remote["collector", "traj_ids"] >> 32) == 3).all()
    assert not torch.isin(frames["observation"][:, 0], torch.tensor([111.0, 112, 444, 555])).any()
    assert (frames[frames["collector", "worker_id"] == 0]["collector", "traj_ids"] >> 32 == 0).all()


async def test_a_hello_waiting_for_a_slot_must_not_speak_first(anyio_backend: str) -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=EchoPolicy(), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1) as collector:
            await held_back(collector)
            async with Link(collector.endpoint, identity=b"old", heartbeat_interval=0.5) as old, \
                    Link(collector.endpoint, identity=b"eager", heartbeat_interval=0.5) as eager:
                await old.send(hello([2]), kind="hello")
                assert (await old.recv()).kind == "env_welcome"
                await old.send(obs(1), kind="obs")
                await old.send({"o0": torch.zeros(1, 3)}, kind="obs")  # bad and early: dropped
                assert (await old.recv()).kind == "refuse"
                await eager.send(hello([2]), kind="hello")  # queued for slot 1
                await eager.send(obs(2), kind="obs")
                answer = await eager.recv()
                assert answer.kind == "refuse"
                assert "sent 'obs' before its welcome" in answer.body["reason"]
                async with Link(collector.endpoint, identity=b"later",
                                heartbeat_interval=0.5) as later:
                    await later.send(hello([2]), kind="hello")
                    # welcomed once the old request is answered (room again): slot 1 is free
                    welcome = await take_until_answered(collector, later, [])
                    assert (welcome.body["slot"], welcome.body["traj_tag"]) == (1, 3)
                    assert collector.remote_refusals == [
                        "remote env worker b'old' (slot 1) refused: sent a second request "
                        "before its answer",
                        "remote env worker b'eager' refused: sent 'obs' before its welcome"]


async def test_the_old_occupants_unfinished_trajectory_is_not_continued_by_the_new_one(
        anyio_backend: str) -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=EchoPolicy(), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1,
                yield_completed_trajectories=True) as collector:
            async with Link(collector.endpoint, identity=b"old", heartbeat_interval=0.5) as old:
                await old.send(hello([2]), kind="hello")
                steps = (await old.recv()).body["chunk_steps"]
                await old.send(chunk_of(collector, steps, value=700, tag=1), kind="chunk")
                await old.send(None, kind="hello?")  # breaks the agreement: dropped
                answer = await old.recv()
                assert answer.kind == "refuse"
                assert "unexpected message kind" in answer.body["reason"]
            async with Link(collector.endpoint, identity=b"new", heartbeat_interval=0.5) as new:
                await new.send(hello([2]), kind="hello")
                welcome = await new.recv()
                assert (welcome.body["slot"], welcome.body["traj_tag"]) == (1, 3)
                chunk = chunk_of(collector, steps, value=800, tag=3)
                chunk["next", "done"][0, -1] = chunk["next", "terminated"][0, -1] = True
                await new.send(chunk, kind="chunk")
                trajectory = await collector.__anext__()
                while not (trajectory["collector", "worker_id"] == 1).all():
                    assert (trajectory["collector", "worker_id"] == 0).all()
                    trajectory = await collector.__anext__()
    # only the new occupant's frames: the old one's unfinished 700s were discarded
    assert trajectory["observation"][:, 0].tolist() == [800.0] * steps
    assert trajectory["collector", "traj_ids"].tolist() == [3 << 32] * steps


def test_traj_tags_never_repeat_and_name_the_slot_modulo_the_slots() -> None:
    slots = SlotOccupants(first=2, count=2)  # slots 2 and 3 after 2 local workers: 4 in all
    tags = []
    for n in range(3):
        peer = f"p{n}".encode()
        assert slots.place(peer, None) == (2, True)
        tags.append(slots.occupy(peer, 2))
        assert slots.release(peer) == 2
    assert tags == [2, 6, 10]
    assert slots.place(b"x", None) == (2, True) and slots.occupy(b"x", 2) == 14
    assert slots.place(b"y", None) == (3, True) and slots.occupy(b"y", 3) == 3
    assert slots.place(b"z", None) is None  # 2 at a time
    slots.waiting.add(3)
    assert slots.release(b"y") == 3 and slots.draining == {3}
    assert slots.place(b"z", None) == (3, False) and slots.queued == {b"z": (3, None)}
    assert slots.answered(3) is None and slots.take_queued(3) == (b"z", None)
    assert slots.occupy(b"z", 3) == 7
    slots._admissions[2] = (MAX_TAG - 2) // 4 + 1
    with pytest.raises(OverflowError, match=r"slot 2 was taken \d+ times"):
        slots.next_tag(2)
