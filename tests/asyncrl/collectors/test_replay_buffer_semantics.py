"""``replay_buffer=``: TorchRL's meaning. Iteration yields None and the collector fills the
buffer with frames (not ``[T]`` rows); ``start()`` does the same in the background."""

from __future__ import annotations

import warnings

import anyio
import pytest
import torch

from asyncrl import Collector, CollectorError, MultiAsyncCollector, MultiSyncCollector
from tests.asyncrl.det_envs import LENGTHS, make_count_env, make_policy, make_torchrl_count_env

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.collectors import Collector as TorchRLCollector  # noqa: E402
from torchrl.data import LazyTensorStorage, ReplayBuffer  # noqa: E402

LIMIT = 120
COMMON = ["observation", "action", "done", "terminated", "truncated",
          ("next", "observation"), ("next", "reward"), ("next", "done"),
          ("next", "terminated"), ("next", "truncated"), ("collector", "traj_ids")]


def buffer(size: int = 10_000) -> ReplayBuffer:
    return ReplayBuffer(storage=LazyTensorStorage(size))


def check_count_env_frames(frames) -> None:
    """Flat frames of CountEnv: within each trajectory, steps 0, 1, 2... in order."""
    ids = frames["collector", "traj_ids"]
    for tid in ids.unique().tolist():
        traj = frames[ids == tid]
        k = int(traj["observation"][0, 1])
        n = traj.shape[0]
        assert n <= LENGTHS[k % len(LENGTHS)]
        assert traj["observation"][:, 0].tolist() == list(range(int(traj["observation"][0, 0]),
                                                               int(traj["observation"][0, 0]) + n))


@pytest.mark.anyio
async def test_in_process_fills_the_buffer_as_torchrl_and_yields_none() -> None:
    theirs_rb, ours_rb = buffer(), buffer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = TorchRLCollector(make_torchrl_count_env, make_policy(), frames_per_batch=8,
                                  total_frames=40, replay_buffer=theirs_rb)
        try:
            their_yields = list(theirs)
        finally:
            theirs.shutdown()
    with anyio.fail_after(LIMIT):
        async with Collector(make_count_env, make_policy(), frames_per_batch=8,
                             total_frames=40, replay_buffer=ours_rb) as collector:
            our_yields = [b async for b in collector]
            assert collector.frames_collected == 40
    assert our_yields == their_yields == [None] * 5
    assert len(ours_rb) == len(theirs_rb) == 40
    ours, theirs_td = ours_rb[:40], theirs_rb[:40]
    assert ours.batch_size == theirs_td.batch_size == torch.Size([40])
    for key in COMMON:
        assert torch.equal(ours.get(key).to(theirs_td.get(key).dtype), theirs_td.get(key)), key


@pytest.mark.anyio
@pytest.mark.parametrize("sync", [True, False])
async def test_multi_collectors_yield_none_and_store_every_frame(sync: bool) -> None:
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    rb = buffer()
    seen = []
    with anyio.fail_after(LIMIT):
        async with cls(make_count_env, make_policy(), num_workers=2, frames_per_batch=16,
                       total_frames=64, replay_buffer=rb,
                       postproc=lambda td: seen.append(td.batch_size) or td) as collector:
            yielded = [b async for b in collector]
            assert collector.frames_collected == 64
            assert collector.getattr_rb("write_count") == 64  # TorchRL's name
    assert yielded == [None] * 4
    assert len(rb) == 64
    stored = rb[:64]
    assert stored.batch_size == torch.Size([64])
    assert set(stored["collector", "worker_id"].tolist()) == {0, 1}
    check_count_env_frames(stored)
    # postproc sees the batch (TorchRL's layout) before it is written
    assert seen == [torch.Size([2, 8] if sync else [16])] * 4


@pytest.mark.anyio
async def test_start_stores_frames_not_rows() -> None:
    """600 frames in -> len(rb) == 600, with one env per worker or several."""
    for envs in (1, 3):
        rb = buffer()
        with anyio.fail_after(LIMIT):
            async with MultiAsyncCollector(make_count_env, num_workers=2, envs_per_worker=envs,
                                           frames_per_batch=60, total_frames=600,
                                           replay_buffer=rb) as collector:
                collector.start()
                while collector.frames_collected < 600:
                    await anyio.sleep(0.02)
        assert len(rb) == 600, envs
        assert rb[:600].batch_size == torch.Size([600])
        assert rb.sample(8)["next", "reward"].shape == (8, 1)


@pytest.mark.parametrize("make", [
    lambda **kw: Collector(make_count_env, frames_per_batch=8, **kw),
    lambda **kw: MultiSyncCollector(make_count_env, num_workers=2, frames_per_batch=8, **kw),
    lambda **kw: MultiAsyncCollector(make_count_env, num_workers=2, frames_per_batch=8, **kw),
], ids=["Collector", "MultiSyncCollector", "MultiAsyncCollector"])
def test_extend_buffer_false_is_refused_naming_the_asyncrl_way(make) -> None:
    with pytest.raises(ValueError, match=r"extend_buffer=False is not supported: asyncrl "
                                         r"writes whole batches"):
        make(replay_buffer=buffer(), extend_buffer=False)
    assert make(replay_buffer=buffer(), extend_buffer=True).extend_buffer is True


def test_getattr_rb_without_a_buffer_says_so() -> None:
    collector = Collector(make_count_env, frames_per_batch=8)
    with pytest.raises(CollectorError, match="no replay_buffer"):
        collector.getattr_rb("write_count")
