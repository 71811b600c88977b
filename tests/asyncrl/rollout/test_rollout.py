"""Rollout: batches equal a hand-written gymnasium loop, frame for frame.

The reference loop below steps plain gymnasium envs with the same seeds and
the actions the rollout chose (read back from the batch), resets an env right
after its episode ends, and numbers trajectories the way the rollout must.
"""

from __future__ import annotations

import doctest
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase

import asyncrl._rollout.buffers
import asyncrl._rollout.loop
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.loop import Rollout, RolloutOptions
from asyncrl._rollout.policies import RandomPolicy
from asyncrl.collectors._assemble import split_trajectories
from asyncrl.testing import TinyDictEnv

# -- the reference ----------------------------------------------------------------------------


def _flat(obs: Any, prefix: tuple[str, ...] = ()) -> dict[Any, np.ndarray]:
    if not isinstance(obs, dict):
        return {"observation": np.asarray(obs)}
    out: dict[Any, np.ndarray] = {}
    for k, v in obs.items():
        if isinstance(v, dict):
            out.update(_flat(v, (*prefix, k)))
        else:
            out[k if not prefix else (*prefix, k)] = np.asarray(v)
    return out


def reference(
    make_env: Callable[[], gym.Env],
    seed: int,
    actions: np.ndarray,
    *,
    max_frames: int | None = None,
    worker_index: int = 0,
) -> dict[Any, np.ndarray]:
    """Step plain envs with ``actions[i, t]``; return arrays ``[N, T, ...]`` per batch key."""
    n, steps = actions.shape[:2]
    envs = [make_env() for _ in range(n)]
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    count = [0] * n
    traj = list(range(n))
    next_traj = n
    rows: dict[Any, list[list[Any]]] = {}

    def put(key: Any, i: int, value: Any) -> None:
        rows.setdefault(key, [[] for _ in range(n)])[i].append(value)

    for t in range(steps):
        for i, env in enumerate(envs):  # env order within a step: the rollout's too
            for k, v in _flat(obs[i]).items():
                put(k, i, v)
            put(("collector", "traj_ids"), i, (worker_index << 32) | traj[i])
            nxt, r, te, tr, _ = env.step(actions[i, t])
            count[i] += 1
            tr = tr or (max_frames is not None and count[i] >= max_frames)
            for k, v in _flat(nxt).items():
                put(("next", *((k,) if isinstance(k, str) else k)), i, v)
            put(("next", "reward"), i, np.float32(r))
            put(("next", "terminated"), i, te)
            put(("next", "truncated"), i, tr)
            put(("next", "done"), i, te or tr)
            if te or tr:
                nxt, _ = env.reset()
                count[i] = 0
                traj[i], next_traj = next_traj, next_traj + 1
            obs[i] = nxt
    return {k: np.array(v) for k, v in rows.items()}


def assert_matches(batch: TensorDictBase, ref: dict[Any, np.ndarray]) -> None:
    for key, want in ref.items():
        got = batch.get(key).numpy()
        if key[-1] in ("reward", "terminated", "truncated", "done"):
            got = got[..., 0]
        np.testing.assert_array_equal(got, want, err_msg=str(key))
    for key in ("done", "terminated", "truncated"):  # the current obs is never a done one
        assert not batch.get(key).any()


def collect(rollout: Rollout, batches: int) -> TensorDictBase:
    """Several batches joined along time (each cloned: the rollout reuses its buffers)."""
    return torch.cat([rollout.collect().clone() for _ in range(batches)], dim=1)


def actions_of(batch: TensorDictBase) -> np.ndarray:
    return batch.get("action").numpy()


# -- exactness --------------------------------------------------------------------------------


@pytest.mark.parametrize("num_envs", [1, 3])
def test_random_policy_matches_gymnasium_loop(num_envs: int) -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=num_envs), None, 30 * num_envs) as r:
        r.set_seed(11)
        batch = collect(r, 3)
    assert batch.batch_size == (num_envs, 90)
    ref = reference(lambda: gym.make("CartPole-v1"), 11, actions_of(batch))
    assert ref[("next", "done")].sum() >= num_envs  # episode ends inside and across batches
    assert_matches(batch, ref)


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_vector_env_matches_gymnasium_loop(mode: str) -> None:
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    venv = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=AutoresetMode[mode])
    # Wrapped, so the pool drives the VectorEnv itself (a bare one is unrolled).
    with Rollout(make_env_pool(RecordEpisodeStatistics(venv)), None, 120) as r:
        r.set_seed(4)
        batch = collect(r, 2)
    assert_matches(batch, reference(lambda: gym.make("CartPole-v1"), 4, actions_of(batch)))


def test_dict_observation_and_box_action() -> None:
    with Rollout(make_env_pool(TinyDictEnv, num_envs=2), None, 14) as r:
        r.set_seed(0)
        batch = collect(r, 2)
    assert batch.get("count").dtype == torch.int64
    assert batch.get(("extra", "flags")).shape == (2, 14, 3)
    assert batch.get(("next", "extra", "flags")).dtype == torch.int8
    action = batch.get("action")
    assert action.shape == (2, 14, 2) and action.dtype == torch.float32
    assert (action.abs() <= 1).all()
    assert_matches(batch, reference(TinyDictEnv, 0, actions_of(batch)))


def test_discrete_observation() -> None:
    with Rollout(make_env_pool("FrozenLake-v1", num_envs=2), None, 60) as r:
        r.set_seed(2)
        batch = r.collect()
    assert batch.get("observation").shape == (2, 30)
    assert_matches(batch, reference(lambda: gym.make("FrozenLake-v1"), 2, actions_of(batch)))


def test_plain_module_policy_box_action() -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Tanh())
    with Rollout(make_env_pool("Pendulum-v1", num_envs=2), module, 40) as r:
        r.set_seed(1)
        batch = r.collect()
    action = batch.get("action")
    assert action.shape == (2, 20, 1) and action.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(action, module(batch.get("observation")))
    assert set(batch.keys()) == {
        "observation",
        "action",
        "done",
        "terminated",
        "truncated",
        "next",
        "collector",
    }
    assert_matches(batch, reference(lambda: gym.make("Pendulum-v1"), 1, actions_of(batch)))


# -- policies that write more keys ------------------------------------------------------------


class ArgmaxPolicy(TensorDictModuleBase):
    """A TensorDict policy writing the action and two extra keys (one nested)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_keys = ["observation"]
        self.out_keys = ["logits", ("stats", "value"), "action"]
        self.net = torch.nn.Linear(4, 2)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        logits = self.net(td.get("observation"))
        td.set("logits", logits)
        td.set(("stats", "value"), logits.sum(-1, keepdim=True))
        td.set("action", logits.argmax(-1))
        return td


def test_tensordict_module_extra_keys() -> None:
    torch.manual_seed(0)
    policy = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    with pytest.raises(ValueError, match="'action'"):  # it never writes one
        Rollout(make_env_pool("CartPole-v1", num_envs=2), policy, 8)

    net = torch.nn.Linear(4, 2)
    policy = TensorDictModule(
        lambda x: (net(x), net(x).argmax(-1)),
        in_keys=["observation"],
        out_keys=["logits", "action"],
    )
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), policy, 20) as r:
        r.set_seed(0)
        batch = r.collect()
    assert batch.get("logits").shape == (2, 10, 2)
    torch.testing.assert_close(batch.get("action"), batch.get("logits").argmax(-1))
    assert_matches(batch, reference(lambda: gym.make("CartPole-v1"), 0, actions_of(batch)))


def test_probabilistic_actor_writes_log_prob() -> None:
    pytest.importorskip("torchrl")
    from torchrl.modules import ProbabilisticActor

    torch.manual_seed(0)
    logits = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    actor = ProbabilisticActor(
        logits,
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    with Rollout(make_env_pool("CartPole-v1", num_envs=3), actor, 30) as r:
        r.set_seed(0)
        batch = r.collect()
    log_prob_key = next(k for k in batch.keys() if "log_prob" in k)
    assert batch.get("action").shape == (3, 10) and batch.get("action").dtype == torch.int64
    assert batch.get("logits").shape == (3, 10, 2)
    dist = torch.distributions.Categorical(logits=batch.get("logits"))
    torch.testing.assert_close(batch.get(log_prob_key), dist.log_prob(batch.get("action")))
    assert_matches(batch, reference(lambda: gym.make("CartPole-v1"), 0, actions_of(batch)))


def test_nested_extra_keys_and_random_init_frames() -> None:
    torch.manual_seed(0)
    with Rollout(
        make_env_pool("CartPole-v1", num_envs=2), ArgmaxPolicy(), 8, init_random_frames=12
    ) as r:
        r.set_seed(0)
        first, second = r.collect().clone(), r.collect().clone()
    assert first.get(("stats", "value")).shape == (2, 4, 1)
    # frames 0..11 are random (6 steps of 2 envs): no policy output there
    assert (first.get("logits") == 0).all() and (second.get("logits")[:, :2] == 0).all()
    assert (second.get("logits")[:, 2:] != 0).all()
    policy_actions = second.get("logits")[:, 2:].argmax(-1)
    torch.testing.assert_close(second.get("action")[:, 2:], policy_actions)
    batch = torch.cat([first, second], 1)
    assert_matches(batch, reference(lambda: gym.make("CartPole-v1"), 0, actions_of(batch)))


@pytest.mark.parametrize("env", ["CartPole-v1", "dict"])
def test_without_next_observations_the_batch_is_the_full_one_less_its_twins(env: str) -> None:
    # compact_obs: a worker told so in its welcome neither keeps nor writes ("next", obs);
    # what it sends must be exactly what dropping them from the full batch gives.
    from asyncrl._protocol import drop_twins
    from asyncrl._protocol.compact_frames import twin_keys

    make: Any = "CartPole-v1" if env == "CartPole-v1" else TinyDictEnv
    batches = []
    for keep in (True, False):
        torch.manual_seed(0)
        policy = ArgmaxPolicy() if env == "CartPole-v1" else None
        with Rollout(make_env_pool(make, num_envs=2), policy, 40, init_random_frames=10,
                     next_observations=keep) as r:
            r.set_seed(0)
            batches.append(torch.cat([r.collect().clone(), r.collect().clone()], 1))
            stored = {key for key in r.buffers.data if key[0] == "next"}  # its buffers
            observed = {("next", *path) for path in r.buffers.observations.paths}
            assert bool(stored & observed) is keep, stored
    full, compact = batches
    assert twin_keys(full) and not twin_keys(compact)
    expected = drop_twins(full)
    keys = sorted(map(str, compact.keys(include_nested=True, leaves_only=True)))
    assert keys == sorted(map(str, expected.keys(include_nested=True, leaves_only=True)))
    for key in expected.keys(include_nested=True, leaves_only=True):
        assert torch.equal(compact.get(key), expected.get(key)), key
    assert compact.get(("next", "done")).any(), "the batches must cross an episode end"


# -- trajectories, versions, limits ---------------------------------------------------------


def test_traj_ids_change_exactly_at_episode_ends_and_are_unique_per_worker() -> None:
    batches = []
    for worker in (0, 1):
        with Rollout(make_env_pool("CartPole-v1", num_envs=2), None, 100, worker_index=worker) as r:
            r.set_seed(0)
            batch = collect(r, 2)
            batches.append(batch)
            assert (batch.get(("collector", "worker_id")) == worker).all()
    for worker, batch in enumerate(batches):
        ids = batch.get(("collector", "traj_ids"))
        done = batch.get(("next", "done"))[..., 0]
        assert (ids[:, 0] == torch.tensor([0, 1]) + (worker << 32)).all()
        changed = ids[:, 1:] != ids[:, :-1]
        torch.testing.assert_close(changed, done[:, :-1])
        local = (ids & 0xFFFFFFFF).unique()
        torch.testing.assert_close(local, torch.arange(local.numel()))  # no gaps, no reuse
    a, b = (set(x.get(("collector", "traj_ids")).unique().tolist()) for x in batches)
    assert not a & b


def test_policy_version_stamped_and_bumped_by_before_step() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), None, 20) as r:
        r.policy_version = 3
        calls = []

        def before_step() -> None:
            calls.append(1)
            if len(calls) == 4:  # weights arrive before the 4th step
                r.policy_version = 4

        r.before_step = before_step
        batch = r.collect()
        versions = batch.get(("collector", "policy_version"))
        assert len(calls) == 10
        assert (versions[:, :3] == 3).all() and (versions[:, 3:] == 4).all()
        r.before_step = None
        assert (r.collect().get(("collector", "policy_version")) == 4).all()


def test_max_frames_per_traj() -> None:
    with Rollout(
        make_env_pool("CartPole-v1", num_envs=2), None, 60,
        options=RolloutOptions(max_frames_per_traj=7),
    ) as r:
        r.set_seed(5)
        batch = collect(r, 2)
    ref = reference(lambda: gym.make("CartPole-v1"), 5, actions_of(batch), max_frames=7)
    assert_matches(batch, ref)
    # every trajectory is at most 7 frames, and the ones cut short are truncated
    split = split_trajectories(batch)
    lengths = split.get(("collector", "mask")).sum(-1)
    assert lengths.max() == 7
    ends = split.get(("next", "truncated"))[..., 0].any(-1)
    assert ends[lengths == 7].all()


def test_set_truncated_marks_batch_end_without_reset() -> None:
    with Rollout(
        make_env_pool("CartPole-v1", num_envs=2), None, 10,
        options=RolloutOptions(set_truncated=True),
    ) as r:
        r.set_seed(0)
        first, second = r.collect().clone(), r.collect().clone()
    assert first.get(("next", "truncated"))[:, -1].all()
    assert first.get(("next", "done"))[:, -1].all()
    assert not first.get(("next", "truncated"))[:, :-1].any()
    # the env went on: the next batch starts where this one stopped
    torch.testing.assert_close(
        second.get("observation")[:, 0], first.get(("next", "observation"))[:, -1]
    )
    torch.testing.assert_close(
        second.get(("collector", "traj_ids"))[:, 0], first.get(("collector", "traj_ids"))[:, -1]
    )


def test_reset_at_each_iter() -> None:
    with Rollout(
        make_env_pool("CartPole-v1", num_envs=2), None, 10,
        options=RolloutOptions(reset_at_each_iter=True),
    ) as r:
        first, second = r.collect().clone(), r.collect().clone()
    ids1, ids2 = first.get(("collector", "traj_ids")), second.get(("collector", "traj_ids"))
    assert not set(ids1.unique().tolist()) & set(ids2.unique().tolist())
    assert (second.get("observation")[:, 0].abs() <= 0.05).all()  # CartPole's reset range


def test_reset_partial_and_set_seed() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=3), None, 6) as r:
        assert r.set_seed(100) == 103
        before = r.collect().get(("collector", "traj_ids"))[:, -1].clone()
        r.reset(torch.tensor([False, True, False]))
        after = r.collect().get(("collector", "traj_ids"))[:, 0]
        assert after[0] == before[0] and after[2] == before[2] and after[1] > before.max()
        with pytest.raises(ValueError, match="shape"):
            r.reset(np.ones(2, dtype=bool))


def test_request_stop_shortens_the_batch() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), None, 40) as r:
        calls = []

        def before_step() -> None:
            calls.append(1)
            if len(calls) == 5:
                r.request_stop()

        r.before_step = before_step
        short = r.collect()
        assert short.batch_size == (2, 5)
        assert r.before_step is before_step  # restored for the next batch
        assert r.collect().batch_size == (2, 20)
        r.before_step = None
        r.request_stop()  # made before the batch starts: it still applies
        assert r.collect().batch_size == (2, 0)
        assert r.collect().batch_size == (2, 20)


def test_collect_max_steps() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), None, 20) as r:
        r.set_seed(0)
        first = r.collect(max_steps=3).clone()
        assert first.batch_size == (2, 3)
        assert r.collect(max_steps=0).batch_size == (2, 0)  # envs untouched
        second = r.collect().clone()
    assert second.batch_size == (2, 10)
    batch = torch.cat([first, second], 1)
    assert_matches(batch, reference(lambda: gym.make("CartPole-v1"), 0, actions_of(batch)))


# -- the returned batch -----------------------------------------------------------------------


def test_batch_views_reused_buffers_but_not_added_keys() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), None, 10) as r:
        first = r.collect()
        kept = first.get("observation").clone()
        first.set("advantage", torch.zeros(2, 5))
        second = r.collect()
        assert "advantage" not in second.keys()
        assert first.get("observation").data_ptr() == second.get("observation").data_ptr()
        assert not torch.equal(first.get("observation"), kept)  # documented: copy to keep


def test_layout_matches_torchrl_collector() -> None:
    pytest.importorskip("torchrl")
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, SerialEnv

    env = SerialEnv(2, lambda: GymEnv("CartPole-v1", categorical_action_encoding=True))
    collector = Collector(env, None, frames_per_batch=8, total_frames=8)
    theirs = next(iter(collector))
    collector.shutdown()
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), None, 8) as r:
        ours = r.collect()
    assert ours.batch_size == theirs.batch_size
    for key in theirs.keys(include_nested=True, leaves_only=True):
        assert ours.get(key).shape == theirs.get(key).shape, key
        assert ours.get(key).dtype == theirs.get(key).dtype, key


def test_batch_goes_through_gae() -> None:
    pytest.importorskip("torchrl")
    from torchrl.objectives.value import GAE

    value = TensorDictModule(
        torch.nn.Linear(4, 1), in_keys=["observation"], out_keys=["state_value"]
    )
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), None, 64) as r:
        batch = r.collect()
        out = GAE(gamma=0.99, lmbda=0.95, value_network=value)(batch)
    assert out.get("advantage").shape == (2, 32, 1)
    assert torch.isfinite(out.get("value_target")).all()


def test_split_trajectories_matches_torchrl() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=3), None, 90) as r:
        r.set_seed(0)
        batch = r.collect()
    ours = split_trajectories(batch)
    n_traj = batch.get(("collector", "traj_ids")).unique().numel()
    assert ours.batch_size[0] == n_traj
    assert ours.get(("collector", "mask")).sum() == 90
    torchrl_utils = pytest.importorskip("torchrl.collectors.utils")
    theirs = torchrl_utils.split_trajectories(batch)
    assert (ours == theirs).all()


def test_torchrl_env_factory() -> None:
    pytest.importorskip("torchrl")
    from torchrl.envs import GymEnv

    def make() -> Any:
        return GymEnv("CartPole-v1", categorical_action_encoding=True)

    with Rollout(make_env_pool(make, num_envs=2), None, 80) as r:
        r.set_seed(0)
        batch = r.collect()
    done = batch.get(("next", "done"))[..., 0]
    ids = batch.get(("collector", "traj_ids"))
    assert done.any()
    torch.testing.assert_close(ids[:, 1:] != ids[:, :-1], done[:, :-1])
    after_reset = batch.get("observation")[:, 1:][done[:, :-1]]
    assert (after_reset.abs() <= 0.05).all()  # CartPole's reset range


def test_storing_device() -> None:
    with Rollout(make_env_pool("CartPole-v1"), None, 4,
                 options=RolloutOptions(storing_device="cpu")) as r:
        assert r.collect().get("observation").device.type == "cpu"


# -- errors -----------------------------------------------------------------------------------


def test_frames_per_batch_must_divide() -> None:
    with pytest.raises(ValueError, match="not a multiple of num_envs=4: use 8 or 12"):
        Rollout(make_env_pool("CartPole-v1", num_envs=4), None, 10)


def test_unsupported_options_and_bad_policies() -> None:
    pool = make_env_pool("CartPole-v1", num_envs=2)
    with pytest.raises(ValueError, match="reset_when_done=False"):
        Rollout(pool, None, 4, options=RolloutOptions(reset_when_done=False))
    with pytest.raises(ValueError, match="worker_index"):
        Rollout(pool, None, 4, worker_index=-1)

    def wrong_shape(td: TensorDictBase) -> TensorDictBase:
        td.set("action", torch.zeros(2, 1, dtype=torch.int64))
        return td

    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        Rollout(pool, wrong_shape, 4)

    def writes_next(td: TensorDictBase) -> TensorDictBase:
        td.set("action", torch.zeros(2, dtype=torch.int64))
        td.set(("next", "hidden"), torch.zeros(2, 3))
        return td

    with pytest.raises(ValueError, match="recurrent"):
        Rollout(pool, writes_next, 4)

    def replaces_obs(td: TensorDictBase) -> TensorDictBase:
        td.set("observation", td.get("observation") * 2)
        td.set("action", torch.zeros(2, dtype=torch.int64))
        return td

    with pytest.raises(ValueError, match="observation"):
        Rollout(pool, replaces_obs, 4)
    pool.close()


def test_random_policy_given_by_user_is_used_and_not_reseeded() -> None:
    policy = RandomPolicy(spaces.Discrete(2), seed=123)
    reference_policy = RandomPolicy(spaces.Discrete(2), seed=123)
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), policy, 8) as r:
        r.set_seed(0)
        batch = r.collect()
    expected = torch.stack(
        [reference_policy(TensorDict({}, batch_size=[2]))["action"] for _ in range(4)], 1
    )
    torch.testing.assert_close(batch.get("action"), expected)


def test_close_is_idempotent_and_collect_after_close_fails() -> None:
    r = Rollout(make_env_pool("CartPole-v1"), None, 2)
    r.close()
    r.close()
    with pytest.raises(RuntimeError, match="close"):
        r.collect()


@pytest.mark.parametrize("module", [asyncrl._rollout.loop, asyncrl._rollout.buffers])
def test_doctests(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0
