"""The collectors' argument checks on their own (asyncrl.collectors._config): exact messages."""

from __future__ import annotations

import pytest

from asyncrl.collectors._config import (
    ThreadOptions,
    WorkerLayout,
    check_cat_results,
    check_in_process_frames,
    check_preemptive_threshold,
    split_frames,
)


def layout(create_env_fn: object = "CartPole-v1", **options: object) -> WorkerLayout:
    arguments: dict[str, object] = {"num_workers": None, "remote_workers": 0,
                                    "envs_per_worker": 1, "listen": None}
    arguments.update(options)
    return WorkerLayout.check(create_env_fn, **arguments)  # type: ignore[arg-type]


# -- workers --------------------------------------------------------------------------------
def test_num_workers_none_is_one_local_worker() -> None:
    assert layout() == WorkerLayout("CartPole-v1", 1, 0, 1)


def test_a_list_of_one_shared_factory_counts_the_workers() -> None:
    def make() -> None: ...

    checked = layout([make, make, make])
    assert (checked.create_env_fn, checked.num_workers, checked.total) == (make, 3, 3)


def test_a_list_must_agree_with_num_workers() -> None:
    def make() -> None: ...

    with pytest.raises(ValueError) as info:
        layout([make, make], num_workers=3)
    assert str(info.value) == "num_workers=3 but 2 env factories were given"


def test_different_factories_per_worker_are_kept_in_order() -> None:
    def a() -> None: ...

    def b() -> None: ...

    checked = layout([a, b, a])
    assert (checked.create_env_fn, checked.num_workers) == ([a, b, a], 3)


def test_an_empty_list_of_factories_is_refused() -> None:
    with pytest.raises(ValueError) as info:
        layout([])
    assert str(info.value) == ("create_env_fn is an empty list: give one env factory per "
                               "worker, or one factory and num_workers=N")


def test_at_least_one_worker() -> None:
    with pytest.raises(ValueError) as info:
        layout(num_workers=0)
    assert str(info.value) == "need at least one worker (num_workers + remote_workers >= 1)"


def test_remote_workers_need_an_address_to_connect_to() -> None:
    with pytest.raises(ValueError) as info:
        layout(remote_workers=2)
    assert str(info.value) == "remote_workers needs listen='tcp://HOST:PORT'"
    checked = layout(num_workers=0, remote_workers=2, listen="tcp://127.0.0.1:0")
    assert (checked.num_workers, checked.remote_workers, checked.total) == (0, 2, 2)


# -- frames ---------------------------------------------------------------------------------
def test_sync_frames_are_split_evenly_over_workers() -> None:
    assert split_frames(24, 3, 2, sync=True) == [8, 8, 8]


def test_async_frames_are_each_workers_batch() -> None:
    assert split_frames(10, 3, 2, sync=False) == [10, 10, 10]


def test_sync_frames_must_fill_every_env_of_every_worker() -> None:
    with pytest.raises(ValueError) as info:
        split_frames(20, 3, 2, sync=True)
    assert str(info.value) == ("sync mode splits frames_per_batch=20 over 3 workers x 2 envs: "
                               "make it a multiple of 6")


def test_a_share_per_worker() -> None:
    assert split_frames([4, 6], 2, 2, sync=True) == [4, 6]
    with pytest.raises(ValueError) as info:
        split_frames([4, 6], 3, 2, sync=True)
    assert str(info.value) == "frames_per_batch has 2 entries for 3 workers"
    with pytest.raises(ValueError) as info:
        split_frames([4, 5], 2, 2, sync=False)
    assert str(info.value) == ("each worker's frames (5) must be a positive multiple of "
                               "envs_per_worker (2)")


def test_in_process_frames_are_whole_steps() -> None:
    assert check_in_process_frames(20, 4) == (20, 4)
    with pytest.raises(ValueError) as info:
        check_in_process_frames(20, 3)
    assert str(info.value) == "frames_per_batch (20) must be a multiple of envs_per_worker (3)"


# -- batches, threads -----------------------------------------------------------------------
@pytest.mark.parametrize(("value", "kept"), [(None, "stack"), ("stack", "stack"), (1, 1)])
def test_cat_results_none_is_torchrl_stack(value: object, kept: object) -> None:
    assert check_cat_results(value) == kept


@pytest.mark.parametrize("value", [0, 1.5, -0.1])
def test_preemptive_threshold_is_a_fraction(value: float) -> None:
    with pytest.raises(ValueError) as info:
        check_preemptive_threshold(value)
    assert str(info.value) == f"preemptive_threshold must be in (0, 1], got {value}"
    assert check_preemptive_threshold(None) is None
    assert check_preemptive_threshold(0.5) == 0.5


def test_thread_options_default_to_the_fork_server() -> None:
    assert ThreadOptions.check(None, 1, None) == ThreadOptions(None, 1, "forkserver")
    assert ThreadOptions.check(4, 2, "spawn") == ThreadOptions(4, 2, "spawn")
    with pytest.raises(ValueError, match="start_method='fork' is not supported"):
        ThreadOptions.check(None, 1, "fork")


# -- one configuration, passed whole ----------------------------------------------------------
def test_every_rollout_option_is_an_argument_of_both_collectors() -> None:
    """A rollout option a constructor lacked would keep its default silently: each
    collector takes every field of RolloutOptions (its devices resolved first)."""
    import inspect

    from asyncrl import Collector, MultiCollector
    from asyncrl.collectors._config import DEVICE_ARGUMENTS, ROLLOUT_ARGUMENTS

    for collector in (Collector, MultiCollector):
        parameters = inspect.signature(collector.__init__).parameters
        missing = [name for name in (*ROLLOUT_ARGUMENTS, *DEVICE_ARGUMENTS)
                   if name not in parameters]
        assert missing == [], f"{collector.__name__} lacks {missing}"


def test_the_arguments_become_one_frozen_config_the_coordinator_gets_whole() -> None:
    import dataclasses

    from asyncrl import MultiAsyncCollector
    from asyncrl._coordinator.loss_policy import LossPolicy

    collector = MultiAsyncCollector(
        "CartPole-v1", num_workers=2, frames_per_batch=8, total_frames=24, prefetch=3,
        max_frames_per_traj=5, set_truncated=True, exploration_type="mode",
        on_worker_loss="continue", init_random_frames=6, compact_obs=True)
    config = collector.config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.listen = "tcp://0.0.0.0:0"  # type: ignore[misc]
    rules = config.coordinator
    assert (rules.sync, rules.share_frames, rules.prefetch, rules.batch_budget) == (
        False, (8, 8), 3, 3)
    assert (rules.init_random_frames, rules.compact_obs, rules.loss_policy) == (
        3, True, LossPolicy("continue"))
    rollout = rules.rollout
    assert (rollout.max_frames_per_traj, rollout.set_truncated,
            rollout.exploration_type.name) == (5, True, "MODE")
    # The collector's attributes read the same object: nothing is copied back.
    assert (collector.num_workers, collector.prefetch, collector.on_worker_loss,
            collector.init_random_frames) == (2, 3, "continue", 6)
    with pytest.raises(AttributeError) as info:
        collector.prefetch = 4  # type: ignore[misc]
    assert str(info.value) == (
        "MultiAsyncCollector.prefetch is read from the checked arguments (collector.config) "
        "and cannot be changed: pass prefetch=... to MultiAsyncCollector(...)")
