"""Collectors end to end: real worker processes over ipc, both anyio backends."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap

import anyio
import gymnasium as gym
import pytest
import torch

from asyncrl import (
    BlockingCollector,
    Collector,
    MultiAsyncCollector,
    MultiCollector,
    MultiSyncCollector,
    WorkerLostError,
)
from asyncrl.testing import CountingEnv, ParamPolicy, failing_env_at_init, failing_env_at_step

pytestmark = pytest.mark.anyio

LIMIT = 90  # generous bound on any single test's waits (2 shared cores, process spawns)
counting = functools.partial(CountingEnv, length=4)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def check_layout(batch, shape) -> None:
    assert tuple(batch.shape) == shape
    for key in ["observation", "action", "done", "terminated", "truncated",
                ("next", "observation"), ("next", "reward"), ("next", "done"),
                ("next", "terminated"), ("next", "truncated"), ("collector", "traj_ids"),
                ("collector", "worker_id"), ("collector", "policy_version")]:
        assert key in batch.keys(include_nested=True), key
    assert batch["next", "reward"].shape == (*shape, 1)


def check_counting_frames(batch) -> None:
    """CountingEnv: obs[0] counts steps in the episode; next obs = obs + 1; episodes of 4."""
    obs, nxt = batch["observation"][..., 0], batch["next", "observation"][..., 0]
    assert torch.equal(nxt, obs + 1)
    assert torch.equal(batch["next", "terminated"][..., 0], nxt == 4)
    # after a terminal step the next frame starts a new episode at 0
    ends = batch["next", "done"][..., :-1, 0]
    assert torch.equal(obs[..., 1:][ends], torch.zeros(int(ends.sum())))


async def test_sync_collector_layout_counts_and_ids() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=20,
                                      total_frames=60) as collector:
            batches = [b async for b in collector]
    assert len(batches) == 3
    for batch in batches:
        check_layout(batch, (2, 10))
        check_counting_frames(batch)
        assert batch["collector", "worker_id"][0].eq(0).all()
        assert batch["collector", "worker_id"][1].eq(1).all()
    traj = torch.cat([b["collector", "traj_ids"] for b in batches], dim=1)
    assert not set(traj[0].tolist()) & set(traj[1].tolist()), "traj ids shared by workers"
    # a trajectory id changes exactly where an episode starts
    starts = torch.cat([b["observation"][..., 0] for b in batches], dim=1) == 0
    changes = torch.ones_like(starts)
    changes[:, 1:] = traj[:, 1:] != traj[:, :-1]
    assert torch.equal(changes[:, 1:], starts[:, 1:])


async def test_async_collector_delivers_exact_total_frames() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiCollector(counting, num_workers=2, sync=False, frames_per_batch=8,
                                  total_frames=40, prefetch=2) as collector:
            assert isinstance(collector, MultiAsyncCollector)
            batches = [b async for b in collector]
    assert len(batches) == 5
    assert sum(b.numel() for b in batches) == 40
    for batch in batches:
        check_layout(batch, (8,))  # one env per worker: [time], as TorchRL's
        check_counting_frames(batch)
    assert {int(b["collector", "worker_id"][0]) for b in batches} <= {0, 1}


async def test_a_slow_trainer_keeps_workers_at_most_prefetch_ahead() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(counting, num_workers=2, frames_per_batch=8,
                                       prefetch=3) as collector:
            taken = 0
            for _ in range(4):
                await collector.__anext__()
                taken += 1
                await anyio.sleep(0.3)  # a slow trainer: the workers could run far ahead
                stats = collector.statistics().workers
                assert len(stats) == 2
                assert all(s.ahead <= 3 for s in stats), stats
                assert sum(s.batches for s in stats) <= taken + 2 * 3, stats


async def test_weights_update_reaches_every_frame_of_the_next_sync_batch() -> None:
    policy = ParamPolicy(1.0)
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(counting, policy, num_workers=2, frames_per_batch=8,
                                      total_frames=-1) as collector:
            first = await collector.__anext__()
            assert first["action"].eq(1).all()
            assert first["collector", "policy_version"].eq(0).all()
            with torch.no_grad():
                policy.value.fill_(-1.0)
            # No silent update: the workers hold a copy until weights are sent.
            unsent = await collector.__anext__()
            assert unsent["action"].eq(1).all()
            assert unsent["collector", "policy_version"].eq(0).all()
            await collector.update_policy_weights()
            assert collector.policy_version == 1
            second = await collector.__anext__()
            assert second["action"].eq(0).all(), "a frame was collected with old weights"
            assert second["collector", "policy_version"].eq(1).all()


async def test_async_frames_carry_the_version_that_produced_them() -> None:
    policy = ParamPolicy(1.0)
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(counting, policy, num_workers=2, frames_per_batch=8,
                                       prefetch=1) as collector:
            await collector.__anext__()
            with torch.no_grad():
                policy.value.fill_(-1.0)
            await collector.update_policy_weights()
            seen_new = False
            for _ in range(8):
                batch = await collector.__anext__()
                version = batch["collector", "policy_version"]
                # the action tells which weights ran; it must agree with the stamp
                assert torch.equal(batch["action"].eq(0), version.eq(1))
                seen_new |= bool(version.eq(1).all())
            assert seen_new


async def test_error_mid_rollout_is_raised_with_type_and_traceback() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(failing_env_at_step, num_workers=2, frames_per_batch=20,
                                      total_frames=-1) as collector:
            with pytest.raises(RuntimeError, match="failed on purpose") as info:
                async for _ in collector:
                    pass
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Traceback" in notes and "CountingEnv" in notes and "step" in notes


async def test_error_at_start_up_is_raised_at_iteration() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(failing_env_at_init, num_workers=1,
                                      frames_per_batch=10) as collector:
            with pytest.raises(ValueError, match="cannot be built"):
                await collector.__anext__()


async def test_aclose_leaves_no_process_and_is_idempotent() -> None:
    with anyio.fail_after(LIMIT):
        collector = MultiSyncCollector(counting, num_workers=2, frames_per_batch=8)
        async with collector:
            await collector.__anext__()
            pids = collector.worker_pids
            assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        await collector.aclose()
    assert not any(pid_alive(p) for p in pids)


async def test_aclose_from_another_task_ends_a_waiting_iteration() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(counting, num_workers=1,
                                      frames_per_batch=2_000_000) as collector:
            ended = anyio.Event()

            async def consume() -> None:
                async for _ in collector:
                    raise AssertionError("no batch of 2M frames can be ready yet")
                ended.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await collector._ensure_ready()  # the worker is inside its long batch
                await anyio.wait_all_tasks_blocked()
                await collector.aclose()
                await ended.wait()
            pids = collector.worker_pids
    assert not any(pid_alive(p) for p in pids)


async def test_cancelling_the_trainer_stops_every_worker() -> None:
    pids: list[int] = []
    with anyio.fail_after(LIMIT):
        with anyio.CancelScope() as scope:
            async with MultiAsyncCollector(counting, num_workers=2, frames_per_batch=8) as c:
                await c.__anext__()
                pids = c.worker_pids
                scope.cancel()
                await anyio.sleep(30)  # cancelled at once
    assert scope.cancelled_caught
    assert pids and not any(pid_alive(p) for p in pids)


async def test_killed_worker_is_reported_not_hung() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=8) as c:
            await c.__anext__()
            os.kill(c.worker_pids[1], signal.SIGKILL)
            with pytest.raises(WorkerLostError, match="worker 1"):
                for _ in range(100):
                    await c.__anext__()


async def test_preemption_cuts_stragglers_short() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=[4, 400_000],
                                      preemptive_threshold=0.5) as collector:
            batch = await collector.__anext__()
    mask = batch["collector", "mask"]
    assert mask[0, :4].all() and not mask[0, 4:].any()
    # The straggler was cut (possibly before its first step): real frames first, then pad.
    real = int(mask[1].sum())
    assert batch.shape[-1] < 400_000 and real < 400_000
    assert mask[1, :real].all() and not mask[1, real:].any()
    check_counting_frames(batch[:, :4][:1])


class ListSink:
    def __init__(self) -> None:
        self.batches: list = []

    def extend(self, td) -> None:
        self.batches.append(td)


async def test_start_fills_the_sink_and_pause_stops_it() -> None:
    sink = ListSink()
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(counting, num_workers=1, frames_per_batch=8,
                                       total_frames=-1, replay_buffer=sink) as collector:
            collector.start()
            while len(sink.batches) < 3:
                await anyio.sleep(0.01)
            async with collector.pause():
                await anyio.sleep(0.2)  # let what was in flight land
                held = len(sink.batches)
                await anyio.sleep(0.5)
                assert len(sink.batches) <= held + 1
            while len(sink.batches) < held + 3:
                await anyio.sleep(0.01)


async def test_in_process_collector_matches_a_gymnasium_loop() -> None:
    seed = 7
    with anyio.fail_after(LIMIT):
        async with Collector("CartPole-v1", frames_per_batch=50, total_frames=100) as c:
            await c.set_seed(seed)
            batches = [b async for b in c]
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    for batch in batches:
        for t in range(batch.shape[-1]):
            assert torch.allclose(batch["observation"][t], torch.as_tensor(obs))
            obs, reward, term, trunc, _ = env.step(int(batch["action"][t]))
            assert torch.allclose(batch["next", "observation"][t], torch.as_tensor(obs))
            assert float(batch["next", "reward"][t]) == reward
            assert bool(batch["next", "terminated"][t]) == term
            assert bool(batch["next", "truncated"][t]) == trunc
            if term or trunc:
                obs, _ = env.reset()


async def test_in_process_weight_sender_applies_between_and_during_batches() -> None:
    policy = ParamPolicy(1.0)
    separate = {"value": torch.tensor([-1.0])}  # a state dict: copied in
    with anyio.fail_after(LIMIT):
        async with Collector(counting, policy, frames_per_batch=8, total_frames=-1) as c:
            batches = c.__aiter__()
            first = await batches.__anext__()
            sender = c.weight_sender()
            # Between batches: applied at once, so an awaited send returns.
            assert await sender.send(separate, timeout=30) == 1
            assert float(policy.value.detach()) == -1.0
            second = await batches.__anext__()
            # During a batch (another task collects): applied at a step boundary.
            async with anyio.create_task_group() as tg:
                results = []

                async def collect() -> None:
                    results.append(await batches.__anext__())

                tg.start_soon(collect)
                with torch.no_grad():
                    policy.value.fill_(2.0)  # the trainer trains the shared object in place
                version = await sender.send_async()
                assert await sender.wait_ack(timeout=30) == {0: version}
            third = await batches.__anext__()
            await c.update_policy_weights()
            fourth = await batches.__anext__()
    assert first["collector", "policy_version"].unique().tolist() == [0]
    assert first["action"].unique().tolist() == [1]
    assert second["collector", "policy_version"].unique().tolist() == [1]
    assert second["action"].unique().tolist() == [0]
    assert third["collector", "policy_version"].unique().tolist() == [2]
    assert third["action"].unique().tolist() == [1]
    assert fourth["collector", "policy_version"].unique().tolist() == [3]
    with pytest.raises(KeyError, match="only the 'policy' model"):
        c.weight_sender("critic")


async def test_multi_collector_worker_matches_a_gymnasium_loop() -> None:
    seed = 11
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", num_workers=2, frames_per_batch=60,
                                      total_frames=120) as c:
            next_seed = await c.set_seed(seed)
            batches = [b async for b in c]
    assert next_seed == seed + 2
    for worker in (0, 1):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=seed + worker)
        for batch in batches:
            for t in range(batch.shape[-1]):
                assert torch.allclose(batch["observation"][worker, t], torch.as_tensor(obs))
                obs, _reward, term, trunc, _ = env.step(int(batch["action"][worker, t]))
                assert bool(batch["next", "done"][worker, t]) == (term or trunc)
                if term or trunc:
                    obs, _ = env.reset()


async def test_control_operations_reach_the_workers() -> None:
    policy = ParamPolicy(2.5)
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(counting, policy, num_workers=2,
                                      frames_per_batch=8) as collector:
            assert await collector.getattr_env("num_envs") == 1
            assert await collector.getattr_policy("training") is True
            state = await collector.state_dict()
            assert sorted(state) == ["worker0", "worker1"]
            assert float(state["worker1"]["policy_state_dict"]["value"]) == 2.5
            state["worker1"]["policy_state_dict"]["value"] = torch.tensor([-1.0])
            await collector.load_state_dict(state)
            await collector.reset()
            batch = await collector.__anext__()
            assert batch["action"][0].eq(1).all() and batch["action"][1].eq(0).all()
            assert batch["observation"][:, 0, 0].eq(0).all()  # reset: episodes start at 0
            assert collector.get_model("policy") is policy
            with pytest.raises(KeyError, match="no weight sync scheme"):
                collector.weight_sender("critic")


def test_blocking_collector_from_plain_code() -> None:
    policy = ParamPolicy(1.0)
    collector = MultiSyncCollector(counting, policy, num_workers=1, frames_per_batch=8,
                                   total_frames=24)
    with BlockingCollector(collector) as c:
        batches = []
        for batch in c:
            batches.append(batch)
            with torch.no_grad():
                policy.value.neg_()
            c.update_policy_weights()
    assert [int(b["collector", "policy_version"].max()) for b in batches] == [0, 1, 2]
    assert [int(b["action"][0, 0]) for b in batches] == [1, 0, 1]


def test_workers_exit_when_the_trainer_process_is_killed(tmp_path) -> None:
    script = textwrap.dedent("""
        import anyio, functools, sys
        from asyncrl import MultiSyncCollector
        from asyncrl.testing import CountingEnv
        async def main():
            async with MultiSyncCollector(functools.partial(CountingEnv, length=4),
                                          num_workers=2, frames_per_batch=8) as c:
                await c.__anext__()
                print(*c.worker_pids, flush=True)
                await anyio.sleep(600)
        anyio.run(main)
    """)
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = trainer.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, line
        trainer.kill()
        trainer.wait(timeout=30)
        anyio.run(_wait_dead, pids)
    finally:
        trainer.kill()


async def _wait_dead(pids: list[int]) -> None:
    with anyio.fail_after(30):
        while any(pid_alive(p) for p in pids):
            await anyio.sleep(0.05)
