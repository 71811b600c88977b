"""Compact batches through real collectors: workers ship ``("next", obs)`` once and the
trainer rebuilds it exactly; ``compact_obs=True`` (TorchRL's) drops it on every collector."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from asyncrl import AsyncBatchedCollector, Collector, CollectorError, MultiCollector
from asyncrl.testing import IdentityEnv, ValuePolicy, frame_identity_problems

pytestmark = pytest.mark.anyio
LIMIT = 120
WIDE = 64  # 512 bytes of float64 per observation: over the compaction threshold


class WideIdentityEnv(IdentityEnv):
    """:class:`IdentityEnv` whose observation is ``[pid, instance, steps, steps, ...]``."""

    def __init__(self, length: int = 4) -> None:
        super().__init__(length)
        self.observation_space = type(self.observation_space)(
            0.0, float(1 << 31), shape=(WIDE,), dtype=np.float64)

    def _obs(self) -> np.ndarray:
        obs = np.full(WIDE, self.steps, dtype=np.float64)
        obs[:2] = self.pid, self.instance
        return obs


def wide_identity_env() -> WideIdentityEnv:
    return WideIdentityEnv(length=4)


def check_exact(batch: TensorDictBase) -> None:
    """Every frame's ("next", obs) is the env's observation after that very step."""
    obs, nxt = batch["observation"], batch["next", "observation"]
    assert torch.equal(nxt[..., :2], obs[..., :2])  # same process, same env
    assert torch.equal(nxt[..., 2:], obs[..., 2:] + 1)  # one step later, resets included


@pytest.mark.parametrize(("sync", "envs"), [(True, 2), (False, 2), (True, 1)],
                         ids=["sync", "async", "sync-unbatched"])
async def test_workers_ship_next_observations_once_and_the_trainer_rebuilds_them(
        anyio_backend: str, sync: bool, envs: int) -> None:
    batches = []
    with anyio.fail_after(LIMIT):
        # On the wire (local workers' batches otherwise go through shared memory).
        async with MultiCollector(wide_identity_env, sync=sync, num_workers=2,
                                  shared_memory_batches=False,
                                  envs_per_worker=envs, frames_per_batch=24,
                                  total_frames=96) as collector:
            async for batch in collector:
                batches.append(batch.clone())
    assert sum(b.numel() for b in batches) == 96
    ends = sum(int(b["next", "done"].sum()) for b in batches)
    assert ends >= 16  # episodes of 4 end inside every share
    for batch in batches:
        check_exact(batch)
    ids = [TensorDict({("next", "observation"): b["next", "observation"][..., :3]},
                      b.batch_size) for b in batches]
    assert frame_identity_problems(ids, from_start=True) == []


def keys_of(batch: TensorDictBase) -> set[Any]:
    return set(batch.keys(include_nested=True, leaves_only=True))


KEPT = {("next", "reward"), ("next", "done"), ("next", "terminated"), ("next", "truncated")}


async def first_batch(collector: Any) -> TensorDictBase:
    with anyio.fail_after(LIMIT):
        async with collector:
            async for batch in collector:
                return batch
    raise AssertionError("no batch")


@pytest.mark.parametrize("kind", ["MultiSyncCollector", "MultiAsyncCollector", "Collector",
                                  "AsyncBatchedCollector"])
async def test_compact_obs_true_drops_next_observations_on_every_collector(
        anyio_backend: str, kind: str) -> None:
    common: dict[str, Any] = {"frames_per_batch": 8, "total_frames": 16, "compact_obs": True}
    if kind == "Collector":
        collector: Any = Collector(wide_identity_env, **common)
    elif kind == "AsyncBatchedCollector":
        collector = AsyncBatchedCollector(wide_identity_env, num_envs=2,
                                          policy=ValuePolicy(1.0), **common)
    else:
        collector = MultiCollector(wide_identity_env, sync=kind == "MultiSyncCollector",
                                   num_workers=2, **common)
    assert collector.compact_obs is True
    batch = await first_batch(collector)
    keys = keys_of(batch)
    assert ("next", "observation") not in keys
    assert "observation" in keys and KEPT <= keys


def test_compact_obs_must_be_a_bool_on_every_collector() -> None:
    with pytest.raises(ValueError, match=r"compact_obs='yes'\): expected True or False"):
        AsyncBatchedCollector(wide_identity_env, num_envs=2, frames_per_batch=8,
                              compact_obs="yes")
    with pytest.raises(ValueError, match="compact_obs=True"):
        Collector(wide_identity_env, frames_per_batch=8, compact_obs="yes")


@pytest.mark.parametrize("kind", ["MultiSyncCollector", "Collector"])
async def test_compact_obs_set_after_construction_drops_by_the_same_rule(
        anyio_backend: str, kind: str) -> None:
    """The workers were told compact_obs=False: the collector drops the twins itself."""
    common: dict[str, Any] = {"frames_per_batch": 8, "total_frames": 16}
    collector: Any = Collector(wide_identity_env, **common) if kind == "Collector" else \
        MultiCollector(wide_identity_env, sync=True, num_workers=2, **common)
    collector.compact_obs = True
    batch = await first_batch(collector)
    keys = keys_of(batch)
    assert ("next", "observation") not in keys
    assert "observation" in keys and KEPT <= keys


def test_compact_obs_false_after_workers_were_told_true_is_refused_naming_the_argument(
        ) -> None:
    collector = MultiCollector(wide_identity_env, sync=False, num_workers=2,
                               frames_per_batch=8, compact_obs=True)
    with pytest.raises(CollectorError, match=r"MultiAsyncCollector.compact_obs = False after "
                       r"MultiAsyncCollector\(compact_obs=True\).*pass compact_obs=False to "
                       r"MultiAsyncCollector\(\.\.\.\) instead"):
        collector.compact_obs = False
    assert collector.compact_obs is True
    collector.compact_obs = True  # what the workers were told: nothing to refuse
    in_process = Collector(wide_identity_env, frames_per_batch=8, compact_obs=True)
    in_process.compact_obs = False  # no worker dropped anything: the batches keep them
    assert in_process.compact_obs is False
    with pytest.raises(ValueError, match=r"Collector\(compact_obs='yes'\): expected True"):
        in_process.compact_obs = "yes"


@pytest.mark.parametrize("offered", [True, False], ids=["offered", "not-offered"])
async def test_workers_compact_only_when_the_welcome_offers_it(
        anyio_backend: str, offered: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A coordinator of an earlier release says nothing of compact batches: workers
    then ship every ("next", obs) whole, so mixed releases talk during a rolling update."""
    import dataclasses

    from asyncrl._coordinator.admission import Admission
    from asyncrl._protocol import collection

    welcome = Admission.welcome

    def welcome_as_told(self: Admission, worker: Any, attempt: int) -> Any:
        send = welcome(self, worker, attempt)
        return dataclasses.replace(send, message=dataclasses.replace(
            send.message, compact_batches=offered))

    monkeypatch.setattr(Admission, "welcome", welcome_as_told)
    patches: list[bool] = []
    from_body = collection.Batch.from_body.__func__  # type: ignore[attr-defined]

    def recording(cls: Any, body: Any, **bounds: Any) -> Any:
        patches.append(body.get("next") is not None)
        return from_body(cls, body, **bounds)

    monkeypatch.setattr(collection.Batch, "from_body", classmethod(recording))
    batches = []
    with anyio.fail_after(LIMIT):
        async with MultiCollector(wide_identity_env, sync=True, num_workers=2,
                                  shared_memory_batches=False,
                                  frames_per_batch=16, total_frames=64) as collector:
            async for batch in collector:
                batches.append(batch.clone())
    assert len(patches) == 4 * 2 and set(patches) == {offered}
    for batch in batches:
        check_exact(batch)
