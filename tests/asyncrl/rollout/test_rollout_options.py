"""RolloutOptions: TorchRL's six rollout options, checked and normalised where they are built."""

from __future__ import annotations

import doctest
import pickle

import pytest
import torch

import asyncrl._rollout.options
from asyncrl import Collector, MultiAsyncCollector, MultiSyncCollector
from asyncrl._rollout.options import RolloutOptions
from asyncrl._rollout.policies import ExplorationType
from asyncrl._worker.spec import WorkerSpec


def test_defaults_are_torchrl_defaults() -> None:
    options = RolloutOptions()
    assert options.max_frames_per_traj is None
    assert options.reset_at_each_iter is False
    assert options.reset_when_done is True
    assert options.set_truncated is False
    assert options.exploration_type is ExplorationType.RANDOM
    assert options.storing_device is None


@pytest.mark.parametrize(("value", "kept"), [(7, 7), (-1, None), (0, None), (None, None)])
def test_max_frames_per_traj_below_one_means_no_limit(value: int | None, kept: int | None) -> None:
    assert RolloutOptions(max_frames_per_traj=value).max_frames_per_traj == kept


@pytest.mark.parametrize("value", [2.5, "7", True])
def test_max_frames_per_traj_must_be_an_int(value: object) -> None:
    with pytest.raises(TypeError) as info:
        RolloutOptions(max_frames_per_traj=value)  # type: ignore[arg-type]
    assert str(info.value) == (f"max_frames_per_traj must be an int (-1 or None: no limit), got "
                               f"{type(value).__name__} {value!r}")


def test_reset_when_done_false_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError) as info:
        RolloutOptions(reset_when_done=False)
    assert str(info.value) == (
        "reset_when_done=False is not supported: gymnasium envs must be reset once an episode "
        "ends, so the rollout always resets finished envs")


@pytest.mark.parametrize(("value", "kept"), [("random", ExplorationType.RANDOM),
                                             ("MODE", ExplorationType.MODE),
                                             (ExplorationType.MEAN, ExplorationType.MEAN),
                                             (None, None)])
def test_exploration_type_is_resolved_once(value: object, kept: object) -> None:
    assert RolloutOptions(exploration_type=value).exploration_type is kept  # type: ignore[arg-type]


def test_unknown_exploration_type_names_the_known_ones() -> None:
    with pytest.raises(ValueError) as info:
        RolloutOptions(exploration_type="greedy")
    assert str(info.value).startswith("exploration_type must be an ExplorationType or one of ")
    assert str(info.value).endswith("; got 'greedy'")


def test_storing_device_becomes_a_torch_device() -> None:
    assert RolloutOptions(storing_device="cpu").storing_device == torch.device("cpu")
    with pytest.raises(ValueError) as info:
        RolloutOptions(storing_device="gpu0")
    assert str(info.value).startswith("storing_device='gpu0' is not a device: expected a "
                                      "torch.device or a device name such as 'cpu' or 'cuda:0' (")
    with pytest.raises(ValueError, match=r"^storing_device='meta': a meta tensor holds no data"):
        RolloutOptions(storing_device="meta")


def test_options_are_frozen_and_travel_by_pickle() -> None:
    options = RolloutOptions(max_frames_per_traj=5, exploration_type="mode", storing_device="cpu")
    with pytest.raises(AttributeError):
        options.set_truncated = True  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(WorkerSpec("CartPole-v1", rollout=options))).rollout == options


def test_a_worker_spec_without_options_gets_the_defaults() -> None:
    # What a remote host (`asyncrl worker`) builds: no rollout options on its command line.
    assert WorkerSpec("CartPole-v1").rollout == RolloutOptions()


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_multi_collectors_build_the_options_once_from_torchrl_arguments(cls: type) -> None:
    collector = cls("CartPole-v1", num_workers=1, frames_per_batch=10, max_frames_per_traj=-1,
                    set_truncated=True, exploration_type="mean", storing_device="cpu")
    # A worker's batch leaves it as host bytes: the trainer stores it (docs/devices.md).
    assert collector._spec.rollout == RolloutOptions(
        set_truncated=True, exploration_type=ExplorationType.MEAN)
    assert collector.devices.storing_device == torch.device("cpu")


def test_the_in_process_collector_builds_the_same_options() -> None:
    collector = Collector("CartPole-v1", frames_per_batch=10, reset_at_each_iter=True)
    assert collector._spec.rollout == RolloutOptions(reset_at_each_iter=True)


@pytest.mark.parametrize("make", [
    lambda **kw: MultiSyncCollector("CartPole-v1", num_workers=1, frames_per_batch=10, **kw),
    lambda **kw: Collector("CartPole-v1", frames_per_batch=10, **kw),
])
def test_a_wrong_rollout_option_fails_in_the_collector_constructor(make: object) -> None:
    with pytest.raises(ValueError, match="reset_when_done=False is not supported"):
        make(reset_when_done=False)  # type: ignore[operator]
    with pytest.raises(ValueError, match="exploration_type must be"):
        make(exploration_type="greedy")  # type: ignore[operator]


def test_doctests() -> None:
    result = doctest.testmod(asyncrl._rollout.options, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
