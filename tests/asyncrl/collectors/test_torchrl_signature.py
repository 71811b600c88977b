"""Every TorchRL 0.14 collector constructor argument is taken with its meaning or refused by name.

The tests walk TorchRL's own signatures (``MultiSyncCollector``, the
``MultiCollector`` base of ``MultiAsyncCollector``, and ``Collector`` for the
in-process collector): a TorchRL release that adds an argument fails
``test_every_torchrl_argument_is_classified`` until asyncrl decides about it.
Accepted arguments are checked to take effect on the collector's
configuration; refused ones to raise an error that names the asyncrl way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import Collector, MultiAsyncCollector, MultiSyncCollector
from asyncrl.weights import SharedMemWeightSyncScheme, ZmqWeightSyncScheme

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.collectors import Collector as TorchRLCollector  # noqa: E402
from torchrl.collectors import MultiAsyncCollector as TorchRLMultiAsync  # noqa: E402
from torchrl.collectors import MultiSyncCollector as TorchRLMultiSync  # noqa: E402
from torchrl.collectors._multi_base import MultiCollector as TorchRLMultiBase  # noqa: E402
from torchrl.envs.utils import ExplorationType  # noqa: E402
from torchrl.weight_update import MultiProcessWeightSyncScheme  # noqa: E402
from torchrl.weight_update import SharedMemWeightSyncScheme as TorchRLSharedMem  # noqa: E402

#: Implemented by other work on asyncrl (their own tests cover them); left out here.
IMPLEMENTED_ELSEWHERE = {
    "device", "storing_device", "env_device", "policy_device",  # device handling
    "trajs_per_batch", "traj_format", "extend_buffer",  # trajectory batches
}

#: Arguments that are not options: the collector's own positional inputs.
POSITIONAL = {"self", "create_env_fn"}


def torchrl_arguments(cls: type) -> list[str]:
    return [name for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and name not in POSITIONAL]


def actor() -> TensorDictModule:
    return TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])


def postproc(td: Any) -> Any:
    return td


class Sink:
    def extend(self, td: Any) -> None:
        pass


Check = Callable[[Any], bool]
# name -> (a TorchRL value, what it does to the asyncrl collector)
SHARED_ACCEPTED: dict[str, tuple[Any, Check]] = {
    "policy": (POLICY := actor(), lambda c: c.policy is POLICY),
    "policy_factory": ("tests.asyncrl.collectors.test_torchrl_signature:actor",
                       lambda c: c._spec.policy_factory.endswith(":actor")),
    "frames_per_batch": (64, lambda c: c.frames_per_batch == 64),
    "total_frames": (640, lambda c: c.total_frames == 640),
    "create_env_kwargs": ({"max_episode_steps": 7},
                          lambda c: c._spec.create_env_kwargs == {"max_episode_steps": 7}),
    "max_frames_per_traj": (5, lambda c: c._spec.rollout.max_frames_per_traj == 5),
    "init_random_frames": (64, lambda c: c.init_random_frames == 64),
    "reset_at_each_iter": (True, lambda c: c._spec.rollout.reset_at_each_iter is True),
    "postproc": (postproc, lambda c: c.postproc is postproc),
    "split_trajs": (True, lambda c: c.split_trajs is True),
    "exploration_type": (ExplorationType.MODE,
                         lambda c: c._spec.rollout.exploration_type.name == "MODE"),
    "reset_when_done": (True, lambda c: c._spec.rollout.reset_when_done is True),
    "update_at_each_batch": (True, lambda c: c.update_at_each_batch is True),
    "set_truncated": (True, lambda c: c._spec.rollout.set_truncated is True),
    "replay_buffer": (SINK := Sink(), lambda c: c.replay_buffer is SINK),
    # asyncrl always does what these say (see test_torchrl_habits / test_torchrl_schemes
    # for runs that show it): accepted, nothing to change.
    "use_buffers": (True, lambda c: True),
    "track_policy_version": (True, lambda c: True),
    "auto_register_policy_transforms": (False, lambda c: True),
    "no_cuda_sync": (False, lambda c: True),
    # TorchRL's meaning: no ('next', obs) in the batches (tests/.../test_compact_obs*)
    "compact_obs": (True, lambda c: c.compact_obs is True),
}
MULTI_ACCEPTED: dict[str, tuple[Any, Check]] = {
    **SHARED_ACCEPTED,
    "num_workers": (2, lambda c: c.num_workers == 2),
    "collector_class": (TorchRLCollector, lambda c: c.num_workers == 2),
    "preemptive_threshold": (0.5, lambda c: c.preemptive_threshold == 0.5),
    "num_threads": (1, lambda c: c.num_threads == 1),
    "num_sub_threads": (2, lambda c: c.num_sub_threads == 2),
    "cat_results": (None, lambda c: c.cat_results == "stack"),  # TorchRL's None: stack
    "weight_sync_schemes": (
        {"policy": MultiProcessWeightSyncScheme(), "critic": TorchRLSharedMem()},
        lambda c: type(c.weight_sync_schemes["policy"]) is ZmqWeightSyncScheme
        and type(c.weight_sync_schemes["critic"]) is SharedMemWeightSyncScheme),
}
IN_PROCESS_ACCEPTED: dict[str, tuple[Any, Check]] = {
    **SHARED_ACCEPTED,
    "backend": ("direct", lambda c: True),  # asyncrl.Collector is TorchRL's "direct"
    # TorchRL 0.14's dispatcher: num_collectors=N means backend="process", sync=False
    "num_collectors": (2, lambda c: type(c) is MultiAsyncCollector and c.num_workers == 2),
    "track_traj_ids": (True, lambda c: True),
    "return_same_td": (True, lambda c: c.return_same_td is True),
}

# name -> (a TorchRL value asyncrl refuses, words of the message that name the asyncrl way)
SHARED_REFUSED: dict[str, tuple[Any, str]] = {
    "use_buffers": (False, "preallocated buffers"),
    "reset_when_done": (False, "always resets finished envs"),
    "trust_policy": (True, "remove the argument"),
    "compile_policy": (True, "policy_factory="),
    "cudagraph_policy": ({"warmup": 2}, "policy_factory="),
    "no_cuda_sync": (True, "remove the argument"),
    "weight_updater": (object(), "weight_sync_schemes="),
    "weight_recv_schemes": ({"policy": MultiProcessWeightSyncScheme()}, "weight_sync_schemes="),
    "track_policy_version": (object(), "('collector', 'policy_version')"),
    "worker_idx": (0, "num_workers=N"),
    "trajs_per_write": (2, "trajs_per_batch="),
    "auto_register_policy_transforms": (True, "in create_env_fn"),
    "pre_collect_hook": (print, "postproc="),
    "post_collect_hook": (print, "postproc="),
    "compact_obs": ("yes", "compact_obs=True"),
}
MULTI_REFUSED: dict[str, tuple[Any, str]] = {
    **SHARED_REFUSED,
    "collector_class": (TorchRLMultiAsync, "MultiAsyncCollector"),
    "init_fn": (print, "create_env_fn or policy_factory"),
}
IN_PROCESS_REFUSED: dict[str, tuple[Any, str]] = {
    **SHARED_REFUSED,
    "backend": ("ray", "remote_workers="),
    "backend_options": ({"x": 1}, "num_collectors=N"),
    "sync": (True, "MultiCollector(num_workers=N, sync=True / False)"),
    "track_traj_ids": (False, "('collector', 'traj_ids')"),
    "interruptor": (object(), "preemptive_threshold="),
    "weight_sync_schemes": ({"policy": MultiProcessWeightSyncScheme()},
                            "update_policy_weights()"),
}


def make_multi(cls: type, **kwargs: Any) -> Any:
    options = {"num_workers": 2, "frames_per_batch": 64, "start_method": "spawn", **kwargs}
    return cls("CartPole-v1", **options)


def make_in_process(**kwargs: Any) -> Collector:
    return Collector("CartPole-v1", **{"frames_per_batch": 64, **kwargs})


CASES = [
    pytest.param(TorchRLMultiSync, MULTI_ACCEPTED, MULTI_REFUSED, id="MultiSyncCollector"),
    pytest.param(TorchRLMultiBase, MULTI_ACCEPTED, MULTI_REFUSED, id="MultiAsyncCollector"),
    pytest.param(TorchRLCollector, IN_PROCESS_ACCEPTED, IN_PROCESS_REFUSED, id="Collector"),
]


@pytest.mark.parametrize(("torchrl_cls", "accepted", "refused"), CASES)
def test_every_torchrl_argument_is_classified(torchrl_cls: type, accepted: dict[str, Any],
                                             refused: dict[str, Any]) -> None:
    names = torchrl_arguments(torchrl_cls)
    assert len(names) > 30  # the real signature was read, not an empty one
    unclassified = [n for n in names
                    if n not in accepted and n not in refused and n not in IMPLEMENTED_ELSEWHERE]
    assert unclassified == []


def build(torchrl_cls: type, **kwargs: Any) -> Any:
    if torchrl_cls is TorchRLCollector:
        return make_in_process(**kwargs)
    return make_multi(MultiAsyncCollector if torchrl_cls is TorchRLMultiBase
                      else MultiSyncCollector, **kwargs)


@pytest.mark.parametrize(("torchrl_cls", "accepted", "refused"), CASES)
def test_accepted_torchrl_arguments_take_effect(torchrl_cls: type, accepted: dict[str, Any],
                                               refused: dict[str, Any]) -> None:
    for name in torchrl_arguments(torchrl_cls):
        if name not in accepted:
            continue
        value, check = accepted[name]
        collector = build(torchrl_cls, **{name: value})
        assert check(collector), f"{name}={value!r} was accepted but did not take effect"


@pytest.mark.parametrize(("torchrl_cls", "accepted", "refused"), CASES)
def test_refused_torchrl_arguments_name_the_asyncrl_way(torchrl_cls: type,
                                                       accepted: dict[str, Any],
                                                       refused: dict[str, Any]) -> None:
    for name in torchrl_arguments(torchrl_cls):
        if name not in refused:
            continue
        value, alternative = refused[name]
        with pytest.raises((TypeError, ValueError)) as info:
            build(torchrl_cls, **{name: value})
        message = str(info.value)
        assert f"{name}=" in message, message  # names the argument
        assert alternative in message, f"{name}: {message}"


def test_torchrl_defaults_are_accepted_together() -> None:
    """A TorchRL call spelt out with every default of an argument asyncrl classifies."""
    defaults = {name: p.default for name, p in
                inspect.signature(TorchRLMultiSync.__init__).parameters.items()
                if name not in POSITIONAL | IMPLEMENTED_ELSEWHERE
                and p.default is not inspect.Parameter.empty}
    collector = make_multi(MultiSyncCollector, **defaults)
    assert collector.frames_per_batch == 64


def test_a_misspelt_argument_is_still_a_type_error_with_suggestions() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'frames_per_bach'.*"
                                        r"frames_per_batch"):
        make_multi(MultiSyncCollector, frames_per_bach=10)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'compile_polcy'.*"
                                        r"compile_policy"):
        make_in_process(compile_polcy=True)


def test_refusal_happens_before_anything_starts() -> None:
    # The check is the constructor's first step: no fork server, no env built.
    with pytest.raises(TypeError, match="weight_sync_schemes="):
        MultiSyncCollector(lambda: 1 / 0, num_workers=2, frames_per_batch=64,
                           weight_updater=object())


def test_torch_module_for_policy_is_accepted() -> None:
    collector = make_multi(MultiSyncCollector, policy=nn.Sequential(nn.Linear(4, 2)))
    assert isinstance(collector.policy, torch.nn.Module)


def test_doctests() -> None:
    import doctest

    import asyncrl._rollout.seeding
    import asyncrl.collectors._torchrl_args
    import asyncrl.collectors._torchrl_habits
    import asyncrl.collectors._updates
    import asyncrl.weights._torchrl

    for module in (asyncrl._rollout.seeding, asyncrl.collectors._torchrl_args,
                   asyncrl.collectors._torchrl_habits, asyncrl.collectors._updates,
                   asyncrl.weights._torchrl):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
