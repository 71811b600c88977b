"""The TorchRL fast path: exactly TorchRL's transforms, or the generic path (torchrl extra)."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
import torch

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from tensordict.nn import NormalParamExtractor, TensorDictModule  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.envs import (  # noqa: E402
    Compose,
    DoubleToFloat,
    ObservationNorm,
    RewardSum,
    StepCounter,
    TransformedEnv,
)
from torchrl.envs.libs.gym import GymEnv  # noqa: E402
from torchrl.modules import ProbabilisticActor, TanhNormal  # noqa: E402

import asyncrl  # noqa: E402
from asyncrl._rollout import torchrl_fast as _torchrl_fast  # noqa: E402
from asyncrl._rollout.envs import make_env_pool  # noqa: E402
from asyncrl._rollout.loop import Rollout  # noqa: E402
from asyncrl._rollout.torchrl_fast import TorchRLGymFastPool, fast_path_refusal  # noqa: E402
from asyncrl._rollout.torchrl_pools import TorchRLPool  # noqa: E402

LIMIT = 120


def pendulum() -> TransformedEnv:
    """The ported PPO script's env (examples/ppo_pendulum.py)."""
    return TransformedEnv(GymEnv("Pendulum-v1"),
                          Compose(DoubleToFloat(), StepCounter(), RewardSum()))


def pendulum_max_steps() -> TransformedEnv:
    # StepCounter's own truncation, well before gymnasium's TimeLimit (200)
    return TransformedEnv(GymEnv("Pendulum-v1"), Compose(StepCounter(max_steps=37), RewardSum()))


def cartpole() -> TransformedEnv:
    # terminations (not only truncations), integer actions
    return TransformedEnv(GymEnv("CartPole-v1", categorical_action_encoding=True),
                          Compose(StepCounter(), RewardSum()))


def bare_pendulum() -> GymEnv:
    return GymEnv("Pendulum-v1")


def tanh_actor() -> ProbabilisticActor:
    net = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 2), NormalParamExtractor())
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticActor(module, in_keys=["loc", "scale"], distribution_class=TanhNormal,
                              distribution_kwargs={"low": -2.0, "high": 2.0},
                              return_log_prob=True)


FACTORIES = [pendulum, pendulum_max_steps, cartpole, bare_pendulum]


@pytest.mark.parametrize("factory", FACTORIES, ids=lambda f: f.__name__)
def test_pool_steps_identical_to_torchrl_transforms(factory) -> None:
    """Same seed, same actions: every buffer equal, step by step, across resets."""
    fast, slow = TorchRLGymFastPool(factory()), TorchRLPool(factory())
    assert (fast.fast_path, slow.fast_path) == (True, False)
    try:
        assert fast.specs == slow.specs
        assert fast.obs_paths == slow.obs_paths
        fast.set_seed(3)
        slow.set_seed(3)
        fast.reset()
        slow.reset()
        rng = np.random.default_rng(0)
        act = fast.specs.action
        ends = 0
        for step in range(450):
            if act.n is not None:
                a = rng.integers(0, act.n, size=(1, *act.shape))
            else:  # beyond the bounds too: clipping is the env's, on both paths
                a = rng.uniform(-3, 3, size=(1, *act.shape)).astype(np.float32)
            fast.step_inplace(a)
            slow.step_inplace(a)
            for name in ("reward", "terminated", "truncated"):
                np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name),
                                              err_msg=f"{name} at step {step}")
            for path, f_arr, s_arr in zip(fast.obs_paths, fast.obs_arrays, slow.obs_arrays,
                                          strict=True):
                assert f_arr.dtype == s_arr.dtype
                np.testing.assert_array_equal(f_arr, s_arr, err_msg=f"{path} at step {step}")
            assert fast.any_done == slow.any_done
            if fast.any_done:
                ends += 1
                done = fast.terminated | fast.truncated
                fast.reset_where(done)
                slow.reset_where(done)
                for f_arr, s_arr in zip(fast.obs_arrays, slow.obs_arrays, strict=True):
                    np.testing.assert_array_equal(f_arr, s_arr)
        assert ends >= 2  # the comparison went through episode ends
    finally:
        fast.close()
        slow.close()


@pytest.mark.parametrize("factory", [pendulum, pendulum_max_steps], ids=lambda f: f.__name__)
def test_rollout_batches_identical_with_a_tanh_normal_actor(factory) -> None:
    """The ported script's case: whole batches, key by key, policy sampling included."""
    batches = []
    for pool_cls in (TorchRLGymFastPool, TorchRLPool):
        torch.manual_seed(0)
        actor = tanh_actor()
        with Rollout(pool_cls(factory()), actor, frames_per_batch=250) as rollout:
            rollout.set_seed(7)
            batches.append([rollout.collect().clone() for _ in range(2)])
    for fast, slow in zip(*batches, strict=True):
        assert set(fast.keys(True, True)) == set(slow.keys(True, True))
        for key in slow.keys(True, True):
            assert fast[key].dtype == slow[key].dtype, key
            assert torch.equal(fast[key], slow[key]), key
    last = batches[0][-1]
    assert last["next", "done"].any()  # episodes ended inside the batches
    assert ("next", "episode_reward") in last.keys(True, True)


def test_make_env_pool_picks_the_fast_path_for_the_ported_script() -> None:
    pool = make_env_pool(pendulum)
    try:
        assert isinstance(pool, TorchRLGymFastPool) and pool.fast_path
    finally:
        pool.close()


class MyStepCounter(StepCounter):
    pass


@pytest.mark.parametrize(
    ("factory", "reason"),
    [
        (lambda: TransformedEnv(GymEnv("Pendulum-v1"),
                                Compose(StepCounter(), ObservationNorm(loc=0.0, scale=2.0,
                                                                       in_keys=["observation"]))),
         "the transform ObservationNorm (known: DoubleToFloat, StepCounter, RewardSum)"),
        (lambda: TransformedEnv(GymEnv("Pendulum-v1"), MyStepCounter()),
         "the transform MyStepCounter (known: DoubleToFloat, StepCounter, RewardSum)"),
        (lambda: GymEnv("Pendulum-v1", frame_skip=2),
         "the base env uses frame_skip, info_dict_reader or from_pixels"),
        (lambda: GymEnv("CartPole-v1"),
         "a OneHot action spec for a Discrete space"),
    ],
    ids=["unknown-transform", "subclass", "frame-skip", "one-hot"],
)
def test_anything_else_keeps_the_generic_path(factory, reason) -> None:
    env = factory()
    assert fast_path_refusal(env) == reason
    with pytest.raises(ValueError, match="no fast path for this TorchRL env"):
        TorchRLGymFastPool(env)
    try:
        pool = make_env_pool(factory)
    except ValueError as exc:  # the generic pool may refuse what it cannot step at all
        pytest.skip(f"the generic pool refuses this env too: {exc}")
    try:
        assert type(pool) is TorchRLPool and not pool.fast_path
        pool.reset(seed=0)
        pool.step(np.zeros((1, *pool.specs.action.shape), dtype=pool.specs.action.dtype))
    finally:
        pool.close()
    env.close()


def test_the_choice_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="asyncrl"):
        make_env_pool(pendulum).close()
        make_env_pool(lambda: TransformedEnv(GymEnv("Pendulum-v1"), MyStepCounter())).close()
    messages = [r.getMessage() for r in caplog.records]
    assert "asyncrl: TorchRL env TimeLimit stepped on the fast path" in messages
    assert ("asyncrl: TorchRL env stepped through TorchRL (no fast path: the transform "
            "MyStepCounter (known: DoubleToFloat, StepCounter, RewardSum))") in messages


@pytest.mark.anyio
async def test_collector_batches_identical_with_and_without_the_fast_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> list:
        torch.manual_seed(0)
        actor = tanh_actor()
        with anyio.fail_after(LIMIT):
            async with asyncrl.Collector(pendulum, actor, frames_per_batch=200,
                                         total_frames=600) as collector:
                await collector.set_seed(11)
                return [batch async for batch in collector]

    fast = await run()
    monkeypatch.setattr(_torchrl_fast, "fast_path_refusal", lambda env: "disabled by the test")
    slow = await run()
    assert len(fast) == len(slow) == 3
    for a, b in zip(fast, slow, strict=True):
        for key in b.keys(True, True):
            assert torch.equal(a[key], b[key]), key


def test_an_env_that_cannot_be_inspected_keeps_the_generic_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(env: object) -> str:
        raise AttributeError("no such attribute")

    monkeypatch.setattr(_torchrl_fast, "fast_path_refusal", broken)
    pool = make_env_pool(pendulum)
    try:
        assert type(pool) is TorchRLPool and not pool.fast_path
    finally:
        pool.close()


def test_doctests() -> None:
    import doctest

    from asyncrl._spawn import absent_modules as _absent_modules

    for module in (_torchrl_fast, _absent_modules):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
