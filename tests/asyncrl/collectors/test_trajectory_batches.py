"""``trajs_per_batch`` / ``traj_format``: whole trajectories, as TorchRL 0.14 yields them.

The in-process collector is compared field by field with TorchRL's ``Collector``
on the same deterministic env and policy; the multi-process collectors (whose
trajectory ids and order differ from TorchRL's by design, see
docs/batch_shapes.md) against the env's known episodes, and MultiSync against
the trajectories TorchRL's MultiSyncCollector yields (as a set).
"""

from __future__ import annotations

import functools
import warnings

import anyio
import pytest
import torch
from tensordict import TensorDict

from asyncrl import Collector, MultiAsyncCollector, MultiSyncCollector
from asyncrl.collectors._trajectories import TrajectoryAssembler
from tests.asyncrl.det_envs import LENGTHS, make_count_env, make_policy, make_torchrl_count_env

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.collectors import Collector as TorchRLCollector  # noqa: E402
from torchrl.collectors.utils import _traj_emit, _traj_ingest  # noqa: E402
from torchrl.data import LazyTensorStorage, ReplayBuffer  # noqa: E402

LIMIT = 120
MASK = ("collector", "mask")
COMMON = ["observation", "action", "done", "terminated", "truncated",
          ("next", "observation"), ("next", "reward"), ("next", "done"),
          ("next", "terminated"), ("next", "truncated"), ("collector", "traj_ids")]


def assert_same(ours: TensorDict, theirs: TensorDict, keys: list) -> None:
    assert ours.batch_size == theirs.batch_size
    for key in keys:
        a, b = ours.get(key), theirs.get(key)
        assert a.shape == b.shape, (key, a.shape, b.shape)
        assert torch.equal(a.to(b.dtype), b), (key, a, b)


def torchrl_batches(**kwargs: object) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector = TorchRLCollector(make_torchrl_count_env, make_policy(), frames_per_batch=8,
                                     total_frames=48, **kwargs)
        try:
            return [b if b is None else b.clone() for b in collector]
        finally:
            collector.shutdown()


async def our_batches(**kwargs: object) -> list:
    with anyio.fail_after(LIMIT):
        async with Collector(make_count_env, make_policy(), frames_per_batch=8,
                             total_frames=48, **kwargs) as collector:
            batches = [b async for b in collector]
            assert collector.frames_collected == 48
            return batches


def episode(k: int, *, worker: int = 0) -> dict:
    """What CountEnv's episode ``k`` holds (see det_envs)."""
    n = LENGTHS[k % len(LENGTHS)]
    t = torch.arange(n, dtype=torch.float32)
    return {"reward": 10.0 * k + t + k % 2, "t": t, "k": k}


def check_episode(traj: TensorDict) -> None:
    """``traj`` ([T], no padding) is one whole episode of CountEnv, in order."""
    k = int(traj["observation"][0, 1])
    want = episode(k)
    assert traj.shape[0] == LENGTHS[k % len(LENGTHS)]
    assert torch.equal(traj["observation"][:, 0], want["t"])
    assert torch.equal(traj["next", "reward"][:, 0], want["reward"])
    assert torch.equal(traj["next", "done"][:, 0], torch.arange(traj.shape[0]) == traj.shape[0] - 1)
    assert len(set(traj["collector", "traj_ids"].tolist())) == 1


def unpad(batch: TensorDict) -> list[TensorDict]:
    return [row[row.get(MASK)].exclude(MASK) for row in batch.unbind(0)]


def split_cat(batch: TensorDict) -> list[TensorDict]:
    ends = torch.nonzero(batch["next", "done"][:, 0]).flatten().tolist()
    starts = [0] + [e + 1 for e in ends[:-1]]
    assert ends and ends[-1] == batch.shape[0] - 1, "a 'cat' batch ends with a done frame"
    return [batch[s:e + 1] for s, e in zip(starts, ends, strict=True)]


# -- the assembler against TorchRL's own ------------------------------------------------------
def synthetic(ids: list[list[int]], done: list[list[int]]) -> TensorDict:
    ids_t = torch.tensor(ids)
    return TensorDict({
        ("collector", "traj_ids"): ids_t,
        "x": torch.arange(ids_t.numel(), dtype=torch.float32).reshape(ids_t.shape) + 1,
        ("next", "done"): torch.tensor(done, dtype=torch.bool)[..., None],
    }, ids_t.shape)


@pytest.mark.parametrize("traj_format", ["padded", "cat"])
def test_the_assembler_matches_torchrl_on_batches_of_two_envs(traj_format: str) -> None:
    batches = [synthetic([[0, 0, 2, 2], [1, 1, 1, 1]], [[0, 1, 0, 0], [0, 0, 0, 0]]),
               synthetic([[2, 3, 3, 3], [1, 4, 4, 4]], [[1, 0, 0, 1], [1, 0, 1, 0]]),
               synthetic([[5, 5, 5, 5], [4, 6, 6, 6]], [[0, 0, 0, 1], [0, 0, 0, 1]])]
    ours = TrajectoryAssembler(2, traj_format)
    partial: dict = {}
    complete: list = []
    got, want = [], []
    for batch in batches:
        ours.ingest(batch)
        _traj_ingest(batch, partial, complete)
        while ours.ready:
            got.append(ours.pop_batch())
        while len(complete) >= 2:
            want.append(_traj_emit(complete, 2, traj_format=traj_format))
    assert len(got) == len(want) == 3
    for a, b in zip(got, want, strict=True):
        assert a.batch_size == b.batch_size
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in b.keys(True, True):
            assert torch.equal(a.get(key), b.get(key)), key


def test_a_trajectory_spanning_batches_is_joined_in_order() -> None:
    assembler = TrajectoryAssembler(1, "cat")
    assembler.ingest(synthetic([[7, 7]], [[0, 0]]))
    assert not assembler.ready
    assembler.ingest(synthetic([[7, 8]], [[1, 0]]))
    traj = assembler.pop_batch()
    assert traj["x"].tolist() == [1.0, 2.0, 1.0]
    assert traj["collector", "traj_ids"].tolist() == [7, 7, 7]


# -- the in-process collector against TorchRL's Collector -------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("traj_format", ["padded", "cat"])
async def test_in_process_batches_equal_torchrl_field_by_field(traj_format: str) -> None:
    theirs = torchrl_batches(trajs_per_batch=3, traj_format=traj_format)
    ours = await our_batches(trajs_per_batch=3, traj_format=traj_format)
    assert len(ours) == len(theirs) >= 4
    keys = COMMON + ([MASK] if traj_format == "padded" else [])
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b, keys)
        if traj_format == "padded":
            pads = ~a.get(MASK)
            assert not a["next", "reward"][pads].any() and not a["observation"][pads].any()
        else:
            assert MASK not in a.keys(include_nested=True)


@pytest.mark.anyio
async def test_in_process_replay_buffer_gets_torchrl_whole_trajectories() -> None:
    theirs_rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    theirs = torchrl_batches(trajs_per_batch=2, replay_buffer=theirs_rb)
    ours_rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    ours = await our_batches(trajs_per_batch=2, replay_buffer=ours_rb)
    assert ours == theirs == [None] * 6  # one None per collected batch
    assert len(ours_rb) == len(theirs_rb) < 48  # the last, unfinished episode is not written
    assert_same(ours_rb[:len(ours_rb)], theirs_rb[:len(theirs_rb)], COMMON)


@pytest.mark.anyio
async def test_reset_at_each_iter_drops_interrupted_episodes() -> None:
    theirs = torchrl_batches(trajs_per_batch=1, traj_format="cat", reset_at_each_iter=True)
    ours = await our_batches(trajs_per_batch=1, traj_format="cat", reset_at_each_iter=True)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b, [k for k in COMMON if k != ("collector", "traj_ids")])


# -- multi-process collectors: whole episodes, padded or flat ---------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("sync", [True, False])
async def test_multi_collectors_yield_whole_episodes_padded(sync: bool) -> None:
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    with anyio.fail_after(LIMIT):
        async with cls(make_count_env, make_policy(), num_workers=2, frames_per_batch=16,
                       total_frames=96, trajs_per_batch=3, traj_format="padded") as collector:
            batches = [b async for b in collector]
            assert collector.frames_collected == 96
    assert len(batches) >= 4
    for batch in batches:
        assert batch.batch_size[0] == 3 and batch.ndim == 2
        mask = batch.get(MASK)
        assert mask[:, 0].all() and mask.any(0).all()  # each row starts real; no empty column
        for traj in unpad(batch):
            check_episode(traj)
        assert not batch["next", "reward"][~mask].any()
        workers = set(batch["collector", "worker_id"][mask].tolist())
        assert workers <= {0, 1}


@pytest.mark.anyio
async def test_multi_sync_cat_format_is_flat_whole_episodes() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(make_count_env, make_policy(), num_workers=2,
                                      frames_per_batch=16, total_frames=64,
                                      trajs_per_batch=2, traj_format="cat") as collector:
            batches = [b async for b in collector]
    assert batches
    for batch in batches:
        assert batch.ndim == 1 and MASK not in batch.keys(include_nested=True)
        trajs = split_cat(batch)
        assert len(trajs) == 2
        for traj in trajs:
            check_episode(traj)


@pytest.mark.anyio
@pytest.mark.parametrize("sync", [True, False])
async def test_multi_collectors_write_whole_episodes_into_the_replay_buffer(sync: bool) -> None:
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    with anyio.fail_after(LIMIT):
        async with cls(make_count_env, make_policy(), num_workers=2, frames_per_batch=16,
                       total_frames=64, trajs_per_batch=2, replay_buffer=rb) as collector:
            yielded = [b async for b in collector]
            assert collector.frames_collected == 64
    assert yielded == [None] * 4  # one per batch of 16 frames
    stored = rb[:len(rb)]
    assert stored.ndim == 1 and MASK not in stored.keys(include_nested=True)
    trajs = split_cat(stored)
    assert sum(t.shape[0] for t in trajs) == len(rb) and len(trajs) >= 8
    for traj in trajs:
        check_episode(traj)


# -- arguments ----------------------------------------------------------------------------------
def test_traj_format_needs_trajs_per_batch() -> None:
    with pytest.raises(ValueError, match="traj_format has no effect unless trajs_per_batch"):
        Collector(make_count_env, frames_per_batch=8, traj_format="cat")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"trajs_per_batch": 2, "traj_format": "flat"}, "traj_format must be 'padded' or 'cat'"),
    ({"trajs_per_batch": 0, "traj_format": "cat"}, "trajs_per_batch must be an int >= 1"),
    ({"trajs_per_batch": 2, "traj_format": "cat", "split_trajs": True}, "without split_trajs"),
])
def test_bad_trajectory_arguments_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiSyncCollector(make_count_env, num_workers=2, frames_per_batch=8, **kwargs)


def test_an_unset_traj_format_warns_as_torchrl() -> None:
    with pytest.warns(FutureWarning, match="default becomes 'cat'"):
        collector = Collector(make_count_env, frames_per_batch=8, trajs_per_batch=2)
    assert collector.traj_format == "padded"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rb = ReplayBuffer(storage=LazyTensorStorage(10))
        Collector(make_count_env, frames_per_batch=8, trajs_per_batch=2, replay_buffer=rb)


# -- multi-process collectors against TorchRL's: the same trajectories ------------------------
def trajectory_set(trajs: list[TensorDict]) -> list[tuple]:
    """Trajectories as comparable values (ids and order differ by design: see the docs)."""
    return sorted((tuple(t["observation"].flatten().tolist()), tuple(t["action"].tolist()),
                   tuple(t["next", "reward"].flatten().tolist()),
                   tuple(t["next", "done"].flatten().tolist())) for t in trajs)


def multi_kwargs(into: str) -> dict:
    return {"trajs_per_batch": 2, "traj_format": "padded"} if into == "padded" \
        else {"trajs_per_batch": 2}


@functools.cache
def torchrl_multi_sync(into: str) -> tuple[list, list | None]:
    """TorchRL's run (the same for both backends: made once)."""
    from torchrl.collectors import MultiSyncCollector as TorchRLMultiSync

    # TorchRL's workers write into a shared buffer: its storage must say so.
    rb = ReplayBuffer(storage=LazyTensorStorage(1000, shared_init=True)) \
        if into == "replay_buffer" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector = TorchRLMultiSync([make_torchrl_count_env] * 2, make_policy(),
                                     frames_per_batch=32, total_frames=64, replay_buffer=rb,
                                     **multi_kwargs(into))
        try:
            batches = [b if b is None else b.clone() for b in collector]
        finally:
            collector.shutdown()
    stored = split_cat(rb[:len(rb)].clone()) if rb is not None else None
    return batches, stored


@pytest.mark.anyio
@pytest.mark.parametrize("into", ["padded", "replay_buffer"])
# Both backends on one xdist worker (TEST_WORKERS): they share TorchRL's cached run.
@pytest.mark.xdist_group("torchrl-multi-sync-reference")
async def test_multi_sync_yields_the_trajectories_torchrl_yields(into: str) -> None:
    their_batches, their_stored = torchrl_multi_sync(into)
    our_rb = ReplayBuffer(storage=LazyTensorStorage(1000)) if into == "replay_buffer" else None
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(make_count_env, make_policy(), num_workers=2,
                                      frames_per_batch=32, total_frames=64,
                                      replay_buffer=our_rb, **multi_kwargs(into)) as collector:
            our_batches = [b async for b in collector]
    assert len(our_batches) == len(their_batches)
    if into == "padded":
        ours = [t for b in our_batches for t in unpad(b)]
        theirs = [t for b in their_batches for t in unpad(b)]
        assert [b.shape[0] for b in our_batches] == [b.shape[0] for b in their_batches]
    else:
        assert our_batches == their_batches == [None, None]
        assert our_rb is not None and their_stored is not None
        ours, theirs = split_cat(our_rb[:len(our_rb)]), their_stored
    assert len(ours) >= 8
    assert trajectory_set(ours) == trajectory_set(theirs)
