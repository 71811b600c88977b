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
