"""EnvPool and specs: construction paths, step/reset semantics, spec wire format."""

from __future__ import annotations

import doctest
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import asyncrl._rollout.env_pools
import asyncrl._rollout.env_specs
import asyncrl._rollout.envs
from asyncrl._rollout.envs import ArraySpec, EnvPool, EnvSpecs, make_env_pool
from asyncrl.testing import TinyDictEnv


def _is_plain(obj: Any) -> bool:
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(_is_plain(v) for v in obj)
    return obj is None or isinstance(obj, str | int | float | bool)


# -- specs ----------------------------------------------------------------------------------


def test_cartpole_specs() -> None:
    with make_env_pool("CartPole-v1", num_envs=3) as pool:
        specs = pool.specs
    assert specs.num_envs == 3
    assert specs.action == ArraySpec((), "int64", 0.0, 1.0, 2)
    obs = specs.observation["observation"]
    assert isinstance(obs, ArraySpec)
    assert obs.shape == (4,) and obs.dtype == "float32"
    assert isinstance(obs.low, tuple) and len(obs.low) == 4


def test_dict_specs_round_trip_and_plain_types() -> None:
    with make_env_pool(TinyDictEnv, num_envs=2) as pool:
        specs = pool.specs
    assert set(specs.observation) == {"pos", "count", "extra"}
    assert specs.observation["count"] == ArraySpec((), "int64", 0.0, 3.0, 4)
    assert specs.observation["extra"]["flags"] == ArraySpec((3,), "int8", 0.0, 1.0)  # type: ignore[index]
    d = specs.to_dict()
    assert _is_plain(d)
    import msgpack

    assert EnvSpecs.from_dict(msgpack.unpackb(msgpack.packb(d))) == specs


def test_unbounded_box_has_no_bounds() -> None:
    spec = asyncrl._rollout.env_specs.array_spec_from_space(spaces.Box(-np.inf, np.inf, (3,)))
    assert spec.low is None and spec.high is None
    assert ArraySpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(num_envs="3"), "EnvSpecs.num_envs"),
        (lambda d: d.update(num_envs=True), "EnvSpecs.num_envs"),
        (lambda d: d.update(num_envs=0), "EnvSpecs.num_envs"),
        (lambda d: d.update(extra=1), "unknown fields"),
        (lambda d: d["action"].update(shape="abc"), "EnvSpecs.action.shape"),
        (lambda d: d["action"].update(shape=[-1]), "EnvSpecs.action.shape"),
        (lambda d: d["action"].update(dtype="object"), "EnvSpecs.action.dtype"),
        (lambda d: d["action"].update(n=1.5), "EnvSpecs.action.n"),
        (lambda d: d["action"].update(low="0"), "EnvSpecs.action.low"),
        (lambda d: d["observation"]["observation"].update(low=[0.0]), "['observation'].low"),
        (lambda d: d["observation"].update({"": d["action"]}), "non-empty strings"),
        (lambda d: d.update(observation=[]), "EnvSpecs.observation"),
        (lambda d: d.update(observation={}), "EnvSpecs.observation"),
        (lambda d: d.update(action=None), "EnvSpecs.action"),
    ],
)
def test_specs_from_dict_rejects_bad_types(mutate: Any, field: str) -> None:
    with make_env_pool("CartPole-v1") as pool:
        d = pool.specs.to_dict()
    mutate(d)
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        EnvSpecs.from_dict(d)


def test_specs_from_dict_bounds_depth() -> None:
    leaf = ArraySpec((1,), "float32").to_dict()
    tree: dict[str, Any] = {"x": leaf}
    for _ in range(20):
        tree = {"x": {"kind": "dict", "items": tree}}
    d = {"observation": tree, "action": leaf, "num_envs": 1}
    with pytest.raises(ValueError, match="deeper"):
        EnvSpecs.from_dict(d)


def test_describe_mismatch_names_fields_and_values() -> None:
    with make_env_pool("CartPole-v1", num_envs=2) as a, make_env_pool("Pendulum-v1") as b:
        problems = a.specs.describe_mismatch(b.specs)
        assert a.specs.describe_mismatch(a.specs) == []
    assert "num_envs: 2 != 1" in problems
    assert "action.dtype: 'int64' != 'float32'" in problems
    assert "observation['observation'].shape: (4,) != (3,)" in problems
    assert not a.specs.describe_mismatch(
        EnvSpecs(a.specs.observation, a.specs.action, 5), include_num_envs=False
    )


# -- construction ---------------------------------------------------------------------------


def test_from_id_callable_and_import_path() -> None:
    for source in (
        "CartPole-v1",
        lambda: gym.make("CartPole-v1"),
        "gymnasium.envs.classic_control.cartpole:CartPoleEnv",
    ):
        with make_env_pool(source, num_envs=2) as pool:
            assert pool.num_envs == 2
            obs = pool.reset(seed=0)
            assert obs["observation"].shape == (2, 4)


def test_create_env_kwargs_are_passed() -> None:
    with make_env_pool(TinyDictEnv, create_env_kwargs={"horizon": 7}) as pool:
        assert pool.specs.observation["count"].n == 8  # type: ignore[union-attr]


def test_bad_env_id_and_import_path() -> None:
    with pytest.raises(ValueError, match="NoSuchEnv-v0"):
        make_env_pool("NoSuchEnv-v0")
    with pytest.raises(ValueError, match="cannot import module"):
        make_env_pool("no_such_module_xyz:make")
    with pytest.raises(ValueError, match="has no attribute"):
        make_env_pool("gymnasium:no_such_factory")
    with pytest.raises(ValueError, match="num_envs"):
        make_env_pool("CartPole-v1", num_envs=0)
    with pytest.raises(TypeError, match="cannot build an env pool"):
        make_env_pool(lambda: 42)


def test_env_instance_needs_factory_for_many() -> None:
    env = gym.make("CartPole-v1")
    with pytest.raises(ValueError, match="needs a factory"):
        make_env_pool(env, num_envs=2)
    with make_env_pool(env) as pool:
        assert pool.num_envs == 1


def test_vector_env_num_envs_wins() -> None:
    venv = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    with make_env_pool(venv, num_envs=1) as pool:
        assert pool.num_envs == 3


def test_vector_env_in_next_step_mode_without_masked_reset_is_refused() -> None:
    venv = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="vector_entry_point")
    with pytest.raises(ValueError, match="SAME_STEP"):
        make_env_pool(venv)
    venv.close()


# -- stepping -------------------------------------------------------------------------------


def _reference_episode(seed: int, actions: list[int]) -> list[tuple[Any, ...]]:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    out = []
    for a in actions:
        nxt, r, te, tr, _ = env.step(a)
        out.append((obs, nxt, r, te, tr))
        obs = env.reset()[0] if te or tr else nxt
    return out


def _pool_episode(pool: EnvPool, seed: int, actions: list[int]) -> list[tuple[Any, ...]]:
    obs = pool.reset(seed=seed)["observation"][0].copy()
    out = []
    for a in actions:
        nxt, r, te, tr = pool.step(np.array([a] * pool.num_envs))
        out.append((obs, nxt["observation"][0].copy(), r[0], te[0], tr[0]))
        done = te | tr
        if done[0]:
            obs = pool.reset_one(0)["observation"].copy()
            done[0] = False
        else:
            obs = nxt["observation"][0].copy()
        pool.reset_where(done)  # the other envs, which we do not compare
    return out


def _wrapped_sync(mode: AutoresetMode) -> Any:
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    # The wrapper keeps the pool from unwrapping the SyncVectorEnv into a list.
    venv = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=mode)
    return RecordEpisodeStatistics(venv)


@pytest.mark.parametrize(
    "source",
    [
        "CartPole-v1",
        "sync-next",
        *(f"wrapped-{m.name}" for m in AutoresetMode),
    ],
)
def test_step_matches_gymnasium_loop_across_episodes(source: str) -> None:
    actions = [1] * 40 + [0] * 30  # several episode ends
    if source == "sync-next":
        pool = make_env_pool(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"))
    elif source.startswith("wrapped-"):
        pool = make_env_pool(_wrapped_sync(AutoresetMode[source.removeprefix("wrapped-")]))
    else:
        pool = make_env_pool(source, num_envs=2)
    with pool:
        got = _pool_episode(pool, 3, actions)
    want = _reference_episode(3, actions)
    assert sum(w[3] for w in want) >= 2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g[0], w[0])
        np.testing.assert_array_equal(g[1], w[1])
        assert (g[2], g[3], g[4]) == (np.float32(w[2]), w[3], w[4])


def test_async_vector_env_same_step() -> None:
    venv = gym.make_vec(
        "CartPole-v1",
        num_envs=2,
        vectorization_mode="async",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP, "context": "fork"},
    )
    actions = [1] * 30
    with make_env_pool(venv) as pool:
        got = _pool_episode(pool, 5, actions)
    for g, w in zip(got, _reference_episode(5, actions), strict=True):
        np.testing.assert_array_equal(g[1], w[1])
        assert g[3] == w[3]


def test_discrete_and_dict_observations() -> None:
    with make_env_pool("FrozenLake-v1", num_envs=2) as pool:
        obs = pool.reset(seed=0)["observation"]
        assert obs.dtype == np.int64 and obs.shape == (2,)
    with make_env_pool(TinyDictEnv, num_envs=2) as pool:
        obs = pool.reset(seed=0)
        assert obs["pos"].shape == (2, 2) and obs["pos"].dtype == np.float32
        assert obs["count"].dtype == np.int64
        assert obs["extra"]["flags"].shape == (2, 3)
        nxt, r, _, _ = pool.step(np.ones((2, 2), np.float32))
        assert (nxt["count"] == 1).all() and r.dtype == np.float32
        row = pool.reset_one(1)
        assert row["count"] == 0 and nxt["count"][0] == 1


def test_buffers_are_reused() -> None:
    with make_env_pool("CartPole-v1", num_envs=2) as pool:
        first = pool.reset(seed=0)["observation"]
        nxt, reward, *_ = pool.step(np.zeros(2, np.int64))
        assert nxt["observation"] is first and reward is pool.reward


def test_set_seed_semantics() -> None:
    with make_env_pool("CartPole-v1", num_envs=3) as pool:
        assert pool.set_seed(10) == 13
        a = pool.reset()["observation"].copy()
        b = pool.reset(seed=10)["observation"].copy()
        np.testing.assert_array_equal(a, b)
        assert pool.set_seed(7, static_seed=True) == 7
        c = pool.reset()["observation"]
        np.testing.assert_array_equal(c[0], c[2])


def test_close_is_idempotent() -> None:
    pool = make_env_pool("CartPole-v1", num_envs=2)
    pool.close()
    pool.close()


def test_torchrl_env() -> None:
    pytest.importorskip("torchrl")
    from torchrl.envs import GymEnv

    with make_env_pool(GymEnv("CartPole-v1", categorical_action_encoding=True)) as pool:
        assert pool.num_envs == 1
        assert pool.specs.action.n == 2
        obs = pool.reset(seed=0)["observation"]
        assert obs.shape == (1, 4)
        for _ in range(30):
            _, r, te, tr = pool.step(np.ones(1, np.int64))
            if te[0] or tr[0]:
                pool.reset_where(te | tr)
        assert r.dtype == np.float32


def test_doctests() -> None:
    for module in (asyncrl._rollout.env_specs, asyncrl._rollout.env_pools, asyncrl._rollout.envs):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, module.__name__
        assert result.attempted > 0, module.__name__


# -- observations that are not what the spec says (issue #22, item 7) ------------------------
@pytest.mark.parametrize(("drift", "got"), [("float64", "float64 of shape (3,)"),
                                            ("int64", "int64 of shape (3,)"),
                                            ("shape", "float32 of shape (4,)"),
                                            ("list", "float64 of shape (4,)")])
@pytest.mark.parametrize("num_envs", [1, 2])
def test_an_observation_that_changes_dtype_or_shape_is_an_error_naming_it(
        drift: str, got: str, num_envs: int) -> None:
    from asyncrl import SpecMismatchError
    from asyncrl._rollout.loop import Rollout
    from asyncrl.testing import DriftingEnv

    pool = make_env_pool(lambda: DriftingEnv(at_step=5, drift=drift), num_envs=num_envs)
    rollout = Rollout(pool, None, frames_per_batch=4 * num_envs, worker_index=3)
    rollout.collect()  # steps 1-4: as the spec says
    with pytest.raises(SpecMismatchError) as caught:
        rollout.collect()
    assert str(caught.value).startswith(
        f"worker 3, env 0: observation 'observation': the spec says float32 of shape (3,), "
        f"the env returned {got}"), caught.value
    rollout.close()


def test_a_lossless_observation_dtype_and_a_discrete_int_are_accepted() -> None:
    from asyncrl import SpecMismatchError
    from asyncrl._rollout.env_pools import check_observation

    buffer = np.zeros((2, 3), dtype=np.float64)
    check_observation(0, ("observation",), np.zeros(3, dtype=np.float32), buffer)
    check_observation(0, ("observation",), [1.0, 2.0, 3.0], buffer)
    check_observation(0, ("observation",), 3, np.zeros(2, dtype=np.int64))
    batch = np.zeros((2, 3), dtype=np.float64)  # a vector env's batch: every env at once
    with pytest.raises(SpecMismatchError, match=r"^every env: observation 'observation': the "
                       r"spec says float32 of shape"):
        check_observation("every env", ("observation",), batch,
                          np.zeros((2, 3), dtype=np.float32))


def test_a_sync_vector_envs_observations_are_checked_env_by_env() -> None:
    from asyncrl import SpecMismatchError
    from asyncrl.testing import DriftingEnv

    venv = SyncVectorEnv([lambda: DriftingEnv(at_step=2, drift="float64")] * 2,
                         autoreset_mode=AutoresetMode.SAME_STEP)
    pool = make_env_pool(venv)
    pool.reset()
    pool.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(SpecMismatchError, match="env 0: observation 'observation': the "
                       "spec says float32 of shape \\(3,\\), the env returned float64"):
        pool.step(np.zeros(2, dtype=np.int64))
