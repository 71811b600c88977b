"""EnvIdSource: what the trainer's registry says about an id, and a worker registering it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import gymnasium as gym
import pytest

from asyncrl._rollout.env_ids import EnvIdSource, is_unknown_env_id
from tests.asyncrl.collectors.runtime_envs import CountingEnv

ENTRY = "tests.asyncrl.collectors.runtime_envs:CountingEnv"


@pytest.fixture
def env_id() -> Iterator[str]:
    name = f"AsyncrlIds{uuid.uuid4().hex[:8]}-v0"
    yield name
    gym.envs.registry.pop(name, None)


def test_a_class_entry_point_is_recorded_as_its_import_path(env_id: str) -> None:
    gym.register(env_id, entry_point=CountingEnv, kwargs={"start": 2.0}, max_episode_steps=9)
    source = EnvIdSource.of(env_id)
    assert source is not None
    assert (source.module, source.spec["entry_point"]) == (
        "tests.asyncrl.collectors.runtime_envs", ENTRY)
    assert (source.spec["kwargs"], source.spec["max_episode_steps"]) == ({"start": 2.0}, 9)


def test_a_worker_that_lacks_the_id_registers_it_from_the_data(env_id: str) -> None:
    gym.register(env_id, entry_point=ENTRY, kwargs={"start": 4.0}, max_episode_steps=2)
    source = EnvIdSource.of(env_id)
    assert source is not None
    del gym.envs.registry[env_id]  # as in a worker forked before main() registered it
    assert is_unknown_env_id(env_id)
    source.ensure()
    env = gym.make(env_id)
    assert env.reset()[0].tolist() == [4.0] and env.spec is not None
    assert env.spec.max_episode_steps == 2


@pytest.mark.parametrize("what", ["lambda", "local class", "kwargs"])
def test_what_cannot_travel_as_data_is_left_out(env_id: str, what: str) -> None:
    class Local(CountingEnv):
        pass

    if what == "lambda":
        gym.register(env_id, entry_point=lambda: CountingEnv())
        assert EnvIdSource.of(env_id) is None  # nothing a worker could import
    elif what == "local class":
        gym.register(env_id, entry_point=Local)
        assert EnvIdSource.of(env_id) is None
    else:  # an object in kwargs: only the module is imported, nothing registered from data
        gym.register(env_id, entry_point=CountingEnv, kwargs={"start": object()})
        source = EnvIdSource.of(env_id)
        assert source is not None and source.spec == {}


def test_not_an_id_is_none() -> None:
    assert EnvIdSource.of("pkg.mod:factory") is None
    assert EnvIdSource.of("ale_py:ALE/Breakout-v5") is None  # gymnasium imports the module
    assert EnvIdSource.of("NoSuchEnvAnywhere-v0") is None
    assert EnvIdSource.of(CountingEnv) is None


def test_a_module_that_cannot_be_imported_names_the_package_to_install() -> None:
    source = EnvIdSource("ALE/Breakout-v5-missing", "no_such_module_here.env", "ale-py")
    with pytest.raises(ValueError, match=(
            r"the gymnasium id 'ALE/Breakout-v5-missing' is registered by module "
            r"'no_such_module_here.env', which this process cannot import \(ModuleNotFoundError"
            r".*\): install 'ale-py' here \(pip install ale-py\)")):
        source.ensure()
