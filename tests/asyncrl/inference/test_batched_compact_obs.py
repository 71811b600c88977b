"""``compact_obs=True`` on AsyncBatchedCollector: the multi collectors' meaning and layout
(TorchRL's: batches without the ``("next", K)`` twins of the observations), and the twins
are never written by the env workers, held by their rings nor sent by remote env hosts."""

from __future__ import annotations

import subprocess
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict

from asyncrl import AsyncBatchedCollector, CollectorError
from asyncrl._protocol import PROTOCOL, EnvLayout, Hello
from asyncrl.testing import CountingEnv, ValuePolicy
from tests.asyncrl.rollout.info_envs import LENGTHS, make_step_info_env
from tests.asyncrl.worker_hosts import env_host, wait_exit
from transports import Link

pytestmark = pytest.mark.anyio
LIMIT = 120
LENGTH = 5  # CountingEnv's default episode length
#: Every entry of a full batch of CountingEnv frames, but ("next", "observation").
COMPACT_KEYS = {
    "observation", "action", "done", "terminated", "truncated",
    ("next", "reward"), ("next", "done"), ("next", "terminated"), ("next", "truncated"),
    ("collector", "traj_ids"), ("collector", "policy_version"), ("collector", "worker_id")}
LAYOUTS = {
    "one-env-workers": {"num_envs": 2},
    "split-worker-process-server": {"num_envs": 4, "envs_per_worker": 4,
                                    "worker_num_splits": 2, "server_backend": "process"},
}


def keys_of(batch: TensorDict) -> set[Any]:
    return set(batch.keys(include_nested=True, leaves_only=True))


async def frames_of(collector: AsyncBatchedCollector) -> TensorDict:
    """Every frame of the run, its batches one after the other."""
    with anyio.fail_after(LIMIT):
        async with collector:
            batches = [b.clone() async for b in collector]
            # What the local env workers' rings hold (before the close unmaps them).
            collector.ring_keys = [set(ring.layout)  # type: ignore[attr-defined]
                                   for ring in collector._channels.rings.values()]
    assert batches
    return torch.cat(batches)


def check_compact_counting_frames(frames: TensorDict) -> int:
    """Each trajectory is one CountingEnv episode's frames in order, without the twins;
    returns the episode ends seen."""
    assert keys_of(frames) == COMPACT_KEYS
    traj = frames["collector", "traj_ids"]
    for tid in traj.unique().tolist():
        t = frames[traj == tid]
        steps = t["observation"][:, 0].long().tolist()
        assert steps == list(range(steps[0], steps[0] + len(steps))), steps
        assert (t["observation"][:, 1] == t["observation"][0, 1]).all()  # one episode
        ends = (t["observation"][:, :1] == LENGTH - 1)
        assert torch.equal(t["next", "terminated"], ends)
        assert torch.equal(t["next", "done"], ends)
        assert not t["next", "truncated"].any() and not t["done"].any()
        assert (t["next", "reward"] == 1).all() and (t["action"] == 1).all()
        assert (t["collector", "worker_id"] == tid >> 32).all()
    return int(frames["next", "done"].sum())


def rebuilt_next_observations(frames: TensorDict) -> torch.Tensor:
    """``("next", "observation")`` rebuilt as TorchRL does from the compact frames of one
    env: the next frame's observation (NaN where an episode ended: its terminal
    observation is in no compact batch; and at the run's last frame)."""
    obs = frames["observation"]
    nxt = torch.full_like(obs, float("nan"))
    nxt[:-1] = obs[1:]
    nxt[frames["next", "done"].squeeze(-1)] = float("nan")
    return nxt


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
async def test_compact_batches_hold_each_observation_once(anyio_backend: str,
                                                          layout: str) -> None:
    compact = AsyncBatchedCollector(CountingEnv, policy=ValuePolicy(1.0), compact_obs=True,
                                    frames_per_batch=16, total_frames=96, **LAYOUTS[layout])
    frames = await frames_of(compact)
    assert frames.numel() == 96
    assert check_compact_counting_frames(frames) >= 8
    # The env workers' rings were made without the twins: neither written nor held.
    rings = compact.ring_keys  # type: ignore[attr-defined]
    assert len(rings) == len(compact.groups)
    assert all({("observation",), ("next", "reward")} <= keys
               and ("next", "observation") not in keys for keys in rings)


async def test_compact_frames_are_the_full_ones_without_the_twins_which_rebuild(
        anyio_backend: str) -> None:
    """One env: both runs step it the same way, so their frames match one for one."""
    common: dict[str, Any] = {"num_envs": 1, "frames_per_batch": 8, "total_frames": 48}
    compact = await frames_of(AsyncBatchedCollector(
        CountingEnv, policy=ValuePolicy(1.0), compact_obs=True, **common))
    full = await frames_of(AsyncBatchedCollector(CountingEnv, policy=ValuePolicy(1.0),
                                                 **common))
    assert keys_of(full) == COMPACT_KEYS | {("next", "observation")}
    assert (full.exclude(("next", "observation")) == compact).all()
    rebuilt = rebuilt_next_observations(compact)
    known = ~rebuilt.isnan().any(-1)
    assert int(known.sum()) == 48 - int(compact["next", "done"].sum()) - 1
    assert torch.equal(rebuilt[known], full["next", "observation"][known])
    # what a compact batch cannot hold: each episode's terminal observation [LENGTH, ep]
    ends = full["next", "done"].squeeze(-1)
    assert (full["next", "observation"][ends][:, 0] == LENGTH).all()


async def test_compact_obs_with_info_keys_keeps_the_info_of_each_step(
        anyio_backend: str) -> None:
    frames = await frames_of(AsyncBatchedCollector(
        make_step_info_env, num_envs=2, envs_per_worker=2, frames_per_batch=24,
        total_frames=96, info_keys=["steps", "stats"], compact_obs=True))
    assert ("next", "observation") not in keys_of(frames)
    assert {("next", "steps"), ("next", "stats", "x")} <= keys_of(frames)
    # StepInfoEnv: observation [t], the step from it says t + 1 (the episode's length at
    # its end), never the reset's -1
    t = frames["observation"][..., 0].long() + 1
    assert torch.equal(frames["next", "steps"], t)
    assert torch.equal(frames["next", "stats", "x"], torch.stack([t, -t], -1).float())
    done = frames["next", "done"].squeeze(-1)
    assert int(done.sum()) >= 8
    assert set(t[done].tolist()) <= set(LENGTHS)


async def test_compact_obs_false_after_an_open_with_true_is_refused() -> None:
    collector = AsyncBatchedCollector(CountingEnv, num_envs=1, policy=ValuePolicy(1.0),
                                      frames_per_batch=8, compact_obs=True)
    collector.compact_obs = False  # not open yet: nothing was told to drop them
    collector.compact_obs = True
    with anyio.fail_after(LIMIT):
        async with collector:
            with pytest.raises(CollectorError, match=(
                    r"AsyncBatchedCollector.compact_obs = False after "
                    r"AsyncBatchedCollector\(compact_obs=True\): its workers were told")):
                collector.compact_obs = False
            batch = await collector.__anext__()
    assert ("next", "observation") not in keys_of(batch)


# -- remote env hosts: told in their welcome -------------------------------------------------

def start_env_host(endpoint: str, backend: str) -> subprocess.Popen[str]:
    return env_host(endpoint, "asyncrl.testing:CountingEnv", backend)


async def test_a_remote_env_host_sends_compact_chunks(anyio_backend: str) -> None:
    collector = AsyncBatchedCollector(
        CountingEnv, num_envs=0, policy=ValuePolicy(1.0), frames_per_batch=16,
        total_frames=64, listen="tcp://127.0.0.1:0", remote_workers=1, compact_obs=True)
    frames: list[TensorDict] = []
    with anyio.fail_after(LIMIT):
        async with collector:
            host = start_env_host(collector.endpoint, anyio_backend)
            try:
                frames = [b.clone() async for b in collector]
            finally:
                await collector.aclose()
                code, err = await wait_exit(host)
    assert code == 0, err
    assert collector.remote_refusals == []
    assert len(frames) == 4
    assert check_compact_counting_frames(torch.cat(frames)) >= 8


def counting_env_hello() -> dict[str, Any]:
    layout = EnvLayout(envs=1, obs=[("float32", [2])], action=("int64", []))  # type: ignore[list-item]
    return Hello(protocol=PROTOCOL, name="old-host", host="test-host", pid=1, role="env",
                 specs=layout.to_specs()).to_body()


async def test_a_host_that_sends_the_twins_anyway_is_refused_saying_why() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=ValuePolicy(1.0), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1, compact_obs=True) as collector:
            async with Link(collector.endpoint, identity=b"old-host",
                            heartbeat_interval=0.5) as host:
                await host.send(counting_env_hello(), kind="hello")
                welcome = await host.recv()
                assert welcome.kind == "env_welcome"
                assert welcome.body["compact_obs"] is True
                remote = collector._env_hub.remote
                assert remote is not None
                schema = remote.schema(1)
                assert ("next", "observation") not in schema
                # a host of an earlier release ignores it: its chunk holds the twins
                schema[("next", "observation")] = schema[("observation",)]
                chunk = TensorDict({p: torch.zeros(s, dtype=d) for p, (d, s) in schema.items()},
                                   list(schema[("action",)][1][:2]))
                await host.send(chunk, kind="chunk")
                answer = await host.recv()
            assert answer.kind == "refuse"
            assert "chunk message: wrong entries" in answer.body["reason"]
            assert ("it holds [('next', 'observation')], which this collector's "
                    "compact_obs=True told it in its welcome to leave out: a host of an "
                    "earlier asyncrl release ignores that, run the trainer's release "
                    "there") in answer.body["reason"]
            assert len(collector.remote_refusals) == 1
            batch = await collector.__anext__()  # the local worker's frames keep coming
            check_compact_counting_frames(batch)


def test_a_welcome_says_compact_obs_only_when_true() -> None:
    from asyncrl._protocol.central_inference import EnvWelcome

    welcome = EnvWelcome(slot=1, traj_tag=1, chunk_steps=4, obs_paths=[["observation"]],
                         extra_paths=[], act={"action": ("int64", [2])}, compact_obs=True)
    assert EnvWelcome.from_body(welcome.to_body()).compact_obs is True
    welcome.compact_obs = False
    assert "compact_obs" not in welcome.to_body()  # as an earlier release's welcome
    assert EnvWelcome.from_body(welcome.to_body()).compact_obs is False
