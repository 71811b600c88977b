"""Every argument a collector acts on shows in its signature (``help()``, IDEs, ``inspect``).

``**torchrl_options`` holds only TorchRL's arguments that a collector takes at values
that change nothing in asyncrl (TorchRL's defaults, or what asyncrl always does), or
refuses naming the asyncrl way. The lists below are what each constructor accepts
through ``**kwargs``: an argument added there fails this test until it is either in the
signature or listed here as such a no-op.
"""

from __future__ import annotations

import inspect

import pytest

from asyncrl import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    MultiAsyncCollector,
    MultiCollector,
    MultiSyncCollector,
)
from asyncrl.collectors._torchrl_args import IN_PROCESS_COLLECTOR, MULTI_COLLECTOR
from asyncrl.collectors.batched import arguments as batched_arguments

#: TorchRL arguments taken through ``**kwargs`` only at values that change nothing here
#: (or refused): the same for every worker-process collector.
MULTI_KWARGS_ONLY = {
    "collector_class", "use_buffers", "trust_policy", "compile_policy", "cudagraph_policy",
    "no_cuda_sync", "weight_updater", "weight_recv_schemes", "track_policy_version",
    "worker_idx", "trajs_per_write", "auto_register_policy_transforms", "pre_collect_hook",
    "post_collect_hook", "init_fn"}
IN_PROCESS_KWARGS_ONLY = {
    *MULTI_KWARGS_ONLY - {"init_fn"}, "backend", "backend_options", "num_collectors", "sync",
    "track_traj_ids", "interruptor", "weight_sync_schemes"}
#: ``AsyncBatchedCollector``: refused, or only TorchRL's value that says what it does anyway.
BATCHED_KWARGS_ONLY = {
    "transport", "device_config", "weight_sync", "worker_affinity", "driver_affinity",
    "reset_at_each_iter", "policy_version_key", "backend", "env_backend",
    "policy_backend", "env_exchange", "weight_sync_model_id"}

COLLECTORS = [MultiSyncCollector, MultiAsyncCollector, MultiCollector, AsyncCollector,
              Collector, AsyncBatchedCollector]


def kwargs_accepted(cls: type) -> set[str]:
    """What ``cls`` takes through ``**kwargs``, read from the tables that decide it."""
    if cls is AsyncBatchedCollector:
        return set(batched_arguments._REFUSED) | set(batched_arguments._ONLY)
    return set(IN_PROCESS_COLLECTOR if cls is Collector else MULTI_COLLECTOR)


def expected_kwargs_only(cls: type) -> set[str]:
    if cls is AsyncBatchedCollector:
        return BATCHED_KWARGS_ONLY
    return IN_PROCESS_KWARGS_ONLY if cls is Collector else MULTI_KWARGS_ONLY


@pytest.mark.parametrize("cls", COLLECTORS, ids=lambda c: c.__name__)
def test_what_kwargs_accepts_is_only_torchrls_no_ops(cls: type) -> None:
    assert kwargs_accepted(cls) == expected_kwargs_only(cls)


@pytest.mark.parametrize("cls", COLLECTORS, ids=lambda c: c.__name__)
def test_the_signature_shows_every_argument_that_acts(cls: type) -> None:
    parameters = inspect.signature(cls).parameters
    assert "compact_obs" in parameters and parameters["compact_obs"].default is False
    assert "frames_per_batch" in parameters
    assert kwargs_accepted(cls) & set(parameters) == set()
    assert "compact_obs" in (inspect.getdoc(cls) or "")


def test_server_config_is_in_the_batched_collectors_signature() -> None:
    assert "server_config" in inspect.signature(AsyncBatchedCollector).parameters


@pytest.mark.parametrize("cls", [Collector, AsyncBatchedCollector], ids=lambda c: c.__name__)
def test_compact_obs_takes_effect_and_a_bad_value_names_the_argument(cls: type) -> None:
    common = {"frames_per_batch": 8, **({"num_envs": 2} if cls is AsyncBatchedCollector else {})}
    assert cls("CartPole-v1", compact_obs=True, **common).compact_obs is True
    assert cls("CartPole-v1", **common).compact_obs is False
    with pytest.raises(ValueError, match=r"compact_obs='yes'\): expected True or False"):
        cls("CartPole-v1", compact_obs="yes", **common)


@pytest.mark.parametrize(("cls", "words"), [
    (MultiSyncCollector, "``frames_per_batch`` is the whole yielded batch"),
    (MultiAsyncCollector, "``frames_per_batch`` is per worker"),
    (AsyncCollector, "``frames_per_batch`` frames per batch, all from its one worker"),
    (AsyncBatchedCollector, "counts\n    the transitions of all envs together"),
    (Collector, "Frames per yielded batch"),
], ids=lambda x: x.__name__ if isinstance(x, type) else "")
def test_each_docstring_says_what_frames_per_batch_counts(cls: type, words: str) -> None:
    assert words in (cls.__doc__ or "")
