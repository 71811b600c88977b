"""``info_keys=`` on AsyncBatchedCollector: the envs' info entries in every frame, with the
other collectors' meaning (``batch["next", k][t]`` is the info of the step that produced
frame t), from local env workers and remote env hosts alike."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable
from typing import Any

import anyio
import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from asyncrl import AsyncBatchedCollector, SpecMismatchError
from asyncrl._protocol import PROTOCOL, EnvLayout, Hello
from asyncrl._protocol.central_inference import WRITES_INFOS
from tests.asyncrl.rollout.info_envs import LENGTHS, StepInfoEnv, make_step_info_env
from tests.asyncrl.worker_hosts import env_host, wait_exit
from transports import Link

pytestmark = pytest.mark.anyio
LIMIT = 120


async def batches_of(collector: AsyncBatchedCollector) -> list[TensorDict]:
    with anyio.fail_after(LIMIT):
        async with collector:
            return [b.clone() async for b in collector]


def check_steps(batch: TensorDict) -> int:
    """Each frame's info is its own step's (t, [t, -t]), never the reset's (-1), terminal
    frames included; returns the episode ends seen."""
    t = batch["next", "observation"][..., 0]
    assert batch["next", "steps"].dtype == torch.int64
    assert torch.equal(batch["next", "steps"], t.long())
    assert batch["next", "stats", "x"].dtype == torch.float32
    assert torch.equal(batch["next", "stats", "x"], torch.stack([t, -t], -1))
    return int(batch["next", "done"].sum())


def double(reward: Any) -> Any:
    return 2 * reward


def episode_env() -> gym.Env:  # type: ignore[type-arg]
    """StepInfoEnv (reward t at step t, episodes of LENGTHS) under RecordEpisodeStatistics,
    its rewards doubled after (the batch's rewards are 2t, the episode's own return
    is the sum of the t)."""
    return gym.wrappers.TransformReward(gym.wrappers.RecordEpisodeStatistics(StepInfoEnv()),
                                        double)


async def test_every_frame_carries_its_own_steps_info() -> None:
    batches = await batches_of(AsyncBatchedCollector(
        make_step_info_env, num_envs=2, envs_per_worker=2, frames_per_batch=24,
        total_frames=96, info_keys=["steps", "stats"]))
    assert len(batches) == 4
    assert sum(check_steps(b) for b in batches) >= 8
    assert set(batches[0].keys(include_nested=True, leaves_only=True)) >= {
        ("next", "steps"), ("next", "stats", "x")}


async def test_split_env_workers_write_their_own_rows_of_info() -> None:
    batches = await batches_of(AsyncBatchedCollector(
        make_step_info_env, num_envs=4, envs_per_worker=4, worker_num_splits=2,
        frames_per_batch=32, total_frames=64, info_keys=[("stats", "x"), "steps"]))
    assert sum(check_steps(b) for b in batches) >= 8


async def test_record_episode_statistics_episode_is_in_the_frame_that_ends_it() -> None:
    collector = AsyncBatchedCollector(
        episode_env, num_envs=2, frames_per_batch=32, total_frames=64,
        info_keys=["episode"])  # never in the first step: its known specs
    batches = await batches_of(collector)
    ends, returns = 0, []
    for batch in batches:
        done = batch["next", "done"].squeeze(-1)
        t = batch["next", "observation"][..., 0].double()
        episode = batch["next", "episode"]
        assert episode["r"].dtype == torch.float64 and episode["l"].dtype == torch.int64
        assert episode["t"].dtype == torch.float64
        # the return of an episode of L steps rewarded 1..L; zeros on the other frames
        assert torch.equal(episode["r"], torch.where(done, t * (t + 1) / 2, 0.0))
        assert torch.equal(episode["l"], torch.where(done, t.long(), 0))
        assert set(episode["l"][done].tolist()) <= set(LENGTHS)
        assert torch.equal(batch["next", "reward"].squeeze(-1), 2 * t.float())
        ends += int(done.sum())
        returns += episode["r"][done].tolist()
    assert ends >= 8
    # statistics() reports the env's own returns (RecordEpisodeStatistics'), not the sums
    # of the doubled rewards, as the other collectors do
    stats = collector.statistics()
    assert stats.episodes == ends
    assert stats.episode_return_mean == pytest.approx(sum(returns) / len(returns))


async def test_given_specs_are_the_batchs_dtypes_and_absent_entries_are_zeros() -> None:
    batches = await batches_of(AsyncBatchedCollector(
        make_step_info_env, num_envs=2, frames_per_batch=16, total_frames=32,
        info_keys={"steps": "float64", "is_success": "bool",
                   "pos": ((2,), "float32")}))
    for batch in batches:
        t = batch["next", "observation"][..., 0]
        assert batch["next", "steps"].dtype == torch.float64
        assert torch.equal(batch["next", "steps"], t.double())
        assert torch.equal(batch["next", "is_success"], torch.zeros(16, dtype=torch.bool))
        assert torch.equal(batch["next", "pos"], torch.zeros(16, 2))


async def test_an_inference_process_batch_carries_each_frames_own_info() -> None:
    # server_backend="process": the chunks reach the trainer through the inference
    # process's rings, the info columns with them
    batches = await batches_of(AsyncBatchedCollector(
        make_step_info_env, num_envs=2, envs_per_worker=2, frames_per_batch=24,
        total_frames=72, info_keys=["steps", "stats"], server_backend="process"))
    assert len(batches) == 3
    assert sum(check_steps(b) for b in batches) >= 6


async def test_each_completed_trajectory_carries_its_own_steps_info() -> None:
    trajectories = await batches_of(AsyncBatchedCollector(
        make_step_info_env, num_envs=2, frames_per_batch=8, total_frames=48,
        info_keys=["steps", "stats"], yield_completed_trajectories=True))
    assert len(trajectories) >= 6
    for trajectory in trajectories:
        length = trajectory.numel()
        assert length in LENGTHS
        # one episode, whole: steps 1..L, its last frame the one that ends it
        assert torch.equal(trajectory["next", "steps"], torch.arange(1, length + 1))
        assert trajectory["next", "done"].squeeze(-1).tolist() == [False] * (length - 1) + [True]
        assert check_steps(trajectory) == 1
        assert trajectory["collector", "traj_ids"].unique().numel() == 1


async def test_a_later_value_of_another_dtype_fails_the_run_naming_the_key() -> None:
    collector = AsyncBatchedCollector(
        functools.partial(StepInfoEnv, bad_at=6), num_envs=1, frames_per_batch=4,
        total_frames=-1, info_keys=["steps"])
    with anyio.fail_after(LIMIT):
        async with collector:
            with pytest.raises(SpecMismatchError) as caught:
                async for _ in collector:
                    pass
    assert str(caught.value).startswith(
        "info entry 'steps': the first step gave int64 of shape (), this step gave float64 of "
        "shape (); an info entry must keep its shape and dtype (or give its spec: "
        "info_keys={('steps',): ((shape), dtype)})")


async def test_an_entry_the_first_step_lacks_needs_its_spec() -> None:
    collector = AsyncBatchedCollector(make_step_info_env, num_envs=1, frames_per_batch=4,
                                      info_keys=["is_success"])
    with anyio.fail_after(LIMIT), pytest.raises(ValueError, match=(
            r"info_keys: 'is_success' was not in the first step's info, so its shape and "
            r"dtype are unknown: give them")):
        async with collector:
            pass


def test_an_info_key_that_clashes_with_the_batch_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"info_keys: 'reward' clashes with the batch's own"):
        AsyncBatchedCollector(make_step_info_env, num_envs=1, frames_per_batch=4,
                              info_keys=["reward"])


def test_the_doctests_of_the_info_columns_and_the_welcome() -> None:
    import doctest

    from asyncrl._inference import info_columns
    from asyncrl._protocol import central_inference

    for module in (info_columns, central_inference):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# -- remote env hosts: the columns travel in the welcome -------------------------------------

def start_env_host(endpoint: str, backend: str,
                   env_path: str = "tests.asyncrl.rollout.info_envs:make_step_info_env"
                   ) -> subprocess.Popen[str]:
    return env_host(endpoint, env_path, backend)


async def test_a_remote_env_host_reads_the_info_keys_its_welcome_names(
        anyio_backend: str) -> None:
    collector = AsyncBatchedCollector(
        make_step_info_env, num_envs=0, frames_per_batch=16, total_frames=64,
        listen="tcp://127.0.0.1:0", remote_workers=1, info_keys=["steps", "stats"])
    batches = []
    with anyio.fail_after(LIMIT):
        async with collector:
            host = start_env_host(collector.endpoint, anyio_backend)  # no --info-key
            try:
                batches = [b.clone() async for b in collector]
            finally:
                await collector.aclose()
                code, err = await wait_exit(host)
    assert code == 0, err
    assert collector.remote_refusals == []
    assert len(batches) == 4
    assert sum(check_steps(b) for b in batches) >= 8


def step_env_hello(*, writes_infos: bool = True) -> dict[str, Any]:
    """A step env host's hello: of this release (it says it writes its welcome's info
    columns), or of the release before (``writes_infos=False``: it says nothing)."""
    layout = EnvLayout(envs=1, obs=[("float32", [1])], action=("int64", []))  # type: ignore[list-item]
    return Hello(protocol=PROTOCOL, name="old-host", host="test-host", pid=1, role="env",
                 specs=layout.to_specs(),
                 rollout=dict(WRITES_INFOS) if writes_infos else {}).to_body()


async def test_a_host_of_an_earlier_release_is_refused_at_its_hello_and_the_run_goes_on(
        ) -> None:
    collector = AsyncBatchedCollector(
        make_step_info_env, num_envs=1, frames_per_batch=8, listen="tcp://127.0.0.1:0",
        remote_workers=1, info_keys=["steps", "stats"])
    events = collector.events()
    with anyio.fail_after(LIMIT):
        async with collector:
            async with Link(collector.endpoint, identity=b"old-host",
                            heartbeat_interval=0.5) as host:
                await host.send(step_env_hello(writes_infos=False), kind="hello")
                answer = await host.recv()  # never welcomed: no slot, no chunk
            assert answer.kind == "refuse"
            assert answer.body["reason"] == (
                "infos: its chunks would lack [('next', 'stats', 'x'), ('next', 'steps')], the "
                "info entries this collector's info_keys asks for in its welcome: a host of "
                "an earlier asyncrl release ignores them (its hello does not say it writes "
                "them), run the trainer's release there")
            [refusal] = collector.remote_refusals
            assert refusal.endswith("refused: " + answer.body["reason"])
            batch = await collector.__anext__()  # the local worker's frames keep coming
            assert check_steps(batch) >= 0
        [refused] = [e async for e in events if e.kind == "refused"]
    assert (refused.name, refused.host, refused.reason) == (
        "old-host", "test-host", answer.body["reason"])


async def test_without_info_keys_a_host_of_an_earlier_release_still_joins() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                make_step_info_env, num_envs=1, frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1) as collector:
            async with Link(collector.endpoint, identity=b"old-host",
                            heartbeat_interval=0.5) as host:
                await host.send(step_env_hello(writes_infos=False), kind="hello")
                welcome = await host.recv()
            assert welcome.kind == "env_welcome" and "infos" not in welcome.body


async def test_a_host_whose_chunks_lack_the_info_columns_is_refused_and_the_run_goes_on(
        ) -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                make_step_info_env, num_envs=1, frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1,
                info_keys=["steps"]) as collector:
            async with Link(collector.endpoint, identity=b"old-host",
                            heartbeat_interval=0.5) as host:
                await host.send(step_env_hello(), kind="hello")
                welcome = await host.recv()
                assert welcome.kind == "env_welcome"
                assert welcome.body["infos"] == [[["steps"], "int64", []]]
                # a host that says it writes them but does not: its chunk has every
                # other entry, and is refused whole
                remote = collector._env_hub.remote
                assert remote is not None
                schema = remote.schema(1)
                chunk = TensorDict({p: torch.zeros(s, dtype=d) for p, (d, s) in schema.items()
                                    if p != ("next", "steps")}, list(schema[("action",)][1][:2]))
                await host.send(chunk, kind="chunk")
                answer = await host.recv()
            assert answer.kind == "refuse"
            assert "chunk message: wrong entries" in answer.body["reason"]
            assert ("it lacks [('next', 'steps')], the info entries this collector's "
                    "info_keys asked for in its welcome: a host of an earlier asyncrl "
                    "release ignores them, run the trainer's release there") in \
                answer.body["reason"]
            assert len(collector.remote_refusals) == 1
            batch = await collector.__anext__()  # the local worker's frames keep coming
            t = batch["next", "observation"][..., 0]
            assert torch.equal(batch["next", "steps"], t.long())



async def local_frames_until(collector: AsyncBatchedCollector, stop: Callable[[], bool]) -> None:
    """Take batches, each frame's ``steps`` info checked against its observation (the local
    worker's frames go on meanwhile), until ``stop()`` after a batch."""
    async for batch in collector:
        t = batch["next", "observation"][..., 0]
        assert torch.equal(batch["next", "steps"], t.long())
        if stop():
            break

async def test_a_remote_hosts_later_mismatch_drops_it_naming_the_key(
        anyio_backend: str) -> None:
    collector = AsyncBatchedCollector(
        make_step_info_env, num_envs=1, frames_per_batch=8, total_frames=-1,
        listen="tcp://127.0.0.1:0", remote_workers=1, info_keys=["steps"])
    with anyio.fail_after(LIMIT):
        async with collector:
            host = start_env_host(collector.endpoint, anyio_backend,
                                  "tests.asyncrl.rollout.info_envs:make_bad_step_info_env")
            try:
                await local_frames_until(
                    collector, lambda: bool(collector.remote_refusals) or host.poll() is not None)
            finally:
                code = await anyio.to_thread.run_sync(host.wait)
    assert host.stderr is not None
    err = host.stderr.read()
    assert code != 0 and "SpecMismatchError" in err, err
    [refusal] = collector.remote_refusals
    assert ("reported an error: asyncrl._errors.SpecMismatchError: info entry 'steps': the "
            "first step gave int64 of shape (), this step gave float64 of shape ()") in refusal


async def test_a_remote_host_that_cannot_write_the_columns_tells_the_trainer_why(
        anyio_backend: str) -> None:
    # its env is a TorchRL env (which reads its own info): its stepper cannot be built
    # with the welcome's info columns, and the trainer hears why before the host exits
    collector = AsyncBatchedCollector(
        make_step_info_env, num_envs=1, frames_per_batch=8, total_frames=-1,
        listen="tcp://127.0.0.1:0", remote_workers=1, info_keys=["steps"])
    events = collector.events()
    with anyio.fail_after(LIMIT):
        async with collector:
            host = start_env_host(collector.endpoint, anyio_backend,
                                  "tests.asyncrl.rollout.info_envs:make_torchrl_step_info_env")
            try:
                await local_frames_until(collector, lambda: bool(collector.remote_refusals))
            finally:
                code = await anyio.to_thread.run_sync(host.wait)
        seen = [e async for e in events]
    assert host.stderr is not None
    err = host.stderr.read()
    assert code != 0 and "ValueError: info_keys: TorchRLPool steps a TorchRL env" in err, err
    why = ("reported an error: builtins.ValueError: info_keys: TorchRLPool steps a TorchRL "
           "env, whose info TorchRL reads itself: register env.set_info_dict_reader("
           "default_info_dict_reader([...])) and the entries come as observations")
    [refusal] = collector.remote_refusals
    assert refusal.startswith("remote env worker ") and refusal.endswith(why), refusal
    [joined] = [e for e in seen if e.kind == "joined" and e.worker == 1]
    [lost] = [e for e in seen if e.kind == "lost" and e.worker == 1]
    assert lost.reason == why, lost.reason
    assert (joined.name, joined.pid) == (lost.name, host.pid) == ("env-1", host.pid)  # admitted
