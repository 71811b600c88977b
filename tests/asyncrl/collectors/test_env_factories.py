"""Per-worker env factories and kwargs (TorchRL's list forms), and what cannot travel."""

from __future__ import annotations

import functools
import re

import anyio
import gymnasium as gym
import pytest
import torch

from asyncrl import MultiAsyncCollector, MultiSyncCollector, SpecMismatchError
from asyncrl.collectors._env_factories import check_picklable, worker_envs

pytestmark = pytest.mark.anyio
LIMIT = 120

ADVICE = ("pass a function defined at module level (at the top of an importable module, or of "
          "your script with the rest under `if __name__ == \"__main__\":`), an import path "
          "'pkg.mod:factory', or functools.partial(module_level_function, ...) to bind "
          "arguments (or create_env_kwargs=)")


def cartpole(length: int = 500) -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=length)


def mountain_car() -> gym.Env:
    return gym.make("MountainCar-v0")


def truncation_steps(batch: torch.Tensor, worker: int) -> list[int]:
    """The steps at which worker ``worker``'s single env was truncated."""
    rows = batch["collector", "worker_id"][:, 0] == worker
    return batch["next", "truncated"][rows][0].reshape(-1).nonzero().reshape(-1).tolist()


# -- the list forms, end to end ----------------------------------------------------------------
async def test_one_factory_per_worker_each_builds_its_own_env() -> None:
    factories = [functools.partial(cartpole, 3), functools.partial(cartpole, 5)]
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(factories, frames_per_batch=20, total_frames=20) as c:
            assert c.num_workers == 2
            [batch] = [b async for b in c]
    assert batch.batch_size == torch.Size([2, 10])
    assert truncation_steps(batch, 0) == [2, 5, 8]
    assert truncation_steps(batch, 1) == [4, 9]


async def test_one_kwargs_dict_per_worker() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(cartpole, num_workers=2, frames_per_batch=24,
                                      total_frames=24,
                                      create_env_kwargs=[{"length": 4}, {"length": 6}]) as c:
            [batch] = [b async for b in c]
    assert truncation_steps(batch, 0) == [3, 7, 11]
    assert truncation_steps(batch, 1) == [5, 11]


async def test_async_mode_takes_the_list_forms_too() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector([cartpole, cartpole], frames_per_batch=8,
                                       total_frames=16,
                                       create_env_kwargs=[{"length": 2}, {"length": 4}]) as c:
            batches = [b async for b in c]
    by_worker = {int(b["collector", "worker_id"][0]): b for b in batches}  # [T]: one env
    for worker, batch in by_worker.items():
        expected = [1, 3, 5, 7] if worker == 0 else [3, 7]
        assert batch["next", "truncated"].reshape(-1).nonzero().reshape(-1).tolist() == expected


async def test_workers_whose_specs_differ_fail_the_run_naming_them() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector([cartpole, mountain_car], frames_per_batch=8,
                                      total_frames=8) as c:
            with pytest.raises(SpecMismatchError) as info:
                await c.__anext__()
    message = str(info.value)
    # Either worker may join first and become the reference.
    match = re.fullmatch(
        r"worker (\d)'s envs cannot be batched with worker (\d)'s: their specs differ \((.*)\)"
        r"\. Every worker's env must have the same observation and action specs and the same "
        r"number of envs: make the per-worker create_env_fn / create_env_kwargs build "
        r"matching envs, or use one collector per kind of env", message)
    assert match is not None, message
    assert {match[1], match[2]} == {"0", "1"}
    diffs = match[3].split("; ")
    pair = ("2 != 3", "(4,) != (2,)") if match[2] == "0" else ("3 != 2", "(2,) != (4,)")
    assert f"action.n: {pair[0]}" in diffs
    assert f"observation['observation'].shape: {pair[1]}" in diffs


# -- argument checks -------------------------------------------------------------------------------
def test_kwargs_forms() -> None:
    assert worker_envs(cartpole, None, 2) == [(cartpole, None), (cartpole, None)]
    assert worker_envs(cartpole, {"length": 3}, 2) == [(cartpole, {"length": 3})] * 2
    assert worker_envs([cartpole, mountain_car], [{"length": 3}, None], 2) == [
        (cartpole, {"length": 3}), (mountain_car, None)]


def test_a_kwargs_list_must_have_one_dict_per_worker() -> None:
    with pytest.raises(ValueError) as info:
        MultiSyncCollector(cartpole, num_workers=3, frames_per_batch=6,
                           create_env_kwargs=[{"length": 3}, {"length": 4}])
    assert str(info.value) == ("create_env_kwargs has 2 dicts for 3 local workers: give one "
                               "dict per worker, or one dict for all")


def test_kwargs_entries_must_be_dicts() -> None:
    with pytest.raises(TypeError) as info:
        worker_envs(cartpole, [{"length": 3}, 4], 2)
    assert str(info.value) == ("create_env_kwargs[1] must be a dict of keyword arguments "
                               "(str keys) or None, got 4")


def test_a_factory_list_must_agree_with_num_workers() -> None:
    with pytest.raises(ValueError) as info:
        MultiSyncCollector([cartpole, cartpole], num_workers=3, frames_per_batch=6)
    assert str(info.value) == "num_workers=3 but 2 env factories were given"


# -- what cannot travel --------------------------------------------------------------------------
def test_a_local_closure_is_refused_at_construction_with_what_to_do() -> None:
    def make() -> gym.Env:
        return cartpole()

    with pytest.raises(TypeError) as info:
        MultiSyncCollector([cartpole, make], frames_per_batch=8)
    assert str(info.value) == (
        f"create_env_fn[1] ({__name__}.{make.__qualname__}) cannot be sent to the local "
        "worker processes (start_method='forkserver' pickles it for each one): "
        f"AttributeError: Can't pickle local object '{make.__qualname__}'; {ADVICE}")


def test_a_lambda_is_refused_with_the_same_advice() -> None:
    factory = lambda: cartpole()  # noqa: E731
    with pytest.raises(TypeError) as info:
        MultiSyncCollector(factory, num_workers=2, frames_per_batch=8, start_method="spawn")
    assert str(info.value).startswith(
        f"create_env_fn ({__name__}.{factory.__qualname__}) cannot be sent to the local "
        "worker processes (start_method='spawn' pickles it for each one): ")
    assert str(info.value).endswith(ADVICE)


def test_a_lambda_in_the_kwargs_is_named_too() -> None:
    with pytest.raises(TypeError, match=r"^create_env_kwargs\[0\] \(\{'render_fn': <function"):
        MultiSyncCollector(cartpole, num_workers=2, frames_per_batch=8,
                           create_env_kwargs=[{"render_fn": lambda: None}, {}])


def test_an_unpicklable_policy_says_use_a_policy_factory() -> None:
    class Local(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(TypeError) as info:
        MultiSyncCollector(cartpole, Local(), num_workers=1, frames_per_batch=8)
    message = str(info.value)
    assert message.startswith("policy (Local()) cannot be sent to the local worker processes")
    assert message.endswith(
        "pass policy_factory= (a module-level function, an import path 'pkg.mod:factory' or "
        "a functools.partial of one) that builds the policy in each worker, or make the "
        "policy's classes and the callables it holds module-level")


def test_module_level_functions_partials_and_import_paths_pass() -> None:
    check_picklable([("create_env_fn", cartpole),
                     ("create_env_fn[1]", functools.partial(cartpole, length=3)),
                     ("create_env_fn[2]", "gymnasium.envs.classic_control:CartPoleEnv"),
                     ("policy", torch.nn.Linear(4, 2))], start_method="forkserver")


def test_no_local_workers_no_pickling() -> None:
    # Remote workers build their own envs: nothing of the trainer's travels.
    MultiSyncCollector(lambda: cartpole(), num_workers=0, remote_workers=1,
                       listen="tcp://127.0.0.1:0", frames_per_batch=8)


def test_a_function_of_an_interactive_session_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    def make() -> gym.Env:
        return cartpole()

    make.__module__, make.__qualname__ = "__main__", "make"
    session = types.ModuleType("__main__")  # a REPL's or notebook's: no __file__
    session.make = make  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", session)
    with pytest.raises(TypeError) as info:
        check_picklable([("create_env_fn", functools.partial(make))], start_method="forkserver")
    assert str(info.value) == (
        "create_env_fn uses 'make', defined in an interactive session (__main__ has no file): "
        f"local worker processes (start_method='forkserver') cannot import it; {ADVICE}")


def test_the_in_process_collector_takes_one_kwargs_dict() -> None:
    from asyncrl._rollout.envs import make_env_pool

    with pytest.raises(TypeError) as info:
        make_env_pool(cartpole, create_env_kwargs=[{"length": 3}])
    assert str(info.value) == ("create_env_kwargs must be a dict of keyword arguments, got "
                               "list; a list of one dict per worker is for MultiSyncCollector "
                               "/ MultiAsyncCollector")
