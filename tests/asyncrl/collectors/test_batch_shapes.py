"""Batch shapes are TorchRL 0.14's, collector by collector (the table in docs/batch_shapes.md).

TorchRL's shapes, as measured with torchrl 0.14.1 (W workers, E envs per worker
as a batched env, T frames per worker and batch):

=================  ==================  ==================
collector          unbatched env       batch_size [E] env
=================  ==================  ==================
Collector          [T]                 [E, T]
MultiSync stack    [W, T]              [W, E, T]
MultiSync cat 0    [W*T]               [W*E, T]
MultiSync cat -1   [W*T]               [E, W*T]
MultiAsync         [T]                 [E, T]
=================  ==================  ==================

asyncrl's ``envs_per_worker=1`` is TorchRL's unbatched env, ``envs_per_worker=E``
its batched one.
"""

from __future__ import annotations

import warnings

import anyio
import pytest
import torch
from tensordict import TensorDict

from asyncrl import BlockingCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from asyncrl.collectors._assemble import assemble
from tests.asyncrl.det_envs import make_count_env, make_policy, make_torchrl_count_env

LIMIT = 120
W, T = 2, 4

#: (cat_results, envs per worker) -> TorchRL's MultiSyncCollector shape.
SYNC = {
    ("stack", 1): [W, T], ("stack", 2): [W, 2, T],
    (None, 1): [W, T], (None, 2): [W, 2, T],
    (0, 1): [W * T], (0, 2): [W * 2, T],
    (-2, 2): [W * 2, T],
    (-1, 1): [W * T], (-1, 2): [2, W * T],
    (1, 1): [W * T], (1, 2): [2, W * T],
}


def share(envs: int, steps: int = T, value: float = 1.0) -> TensorDict:
    return TensorDict({"x": torch.full((envs, steps), value)}, [envs, steps])


@pytest.mark.parametrize(("cat_results", "envs"), list(SYNC))
def test_assembled_rounds_have_torchrl_shapes(cat_results: object, envs: int) -> None:
    batch = assemble([share(envs, value=1.0), share(envs, value=2.0)],
                     "stack" if cat_results is None else cat_results)  # type: ignore[arg-type]
    assert list(batch.shape) == SYNC[(cat_results, envs)]
    # worker 0's frames first: along time with several envs, else in the flat order
    x = batch["x"]
    first = x[:, :T] if cat_results in (-1, 1) and envs > 1 else x.reshape(-1)[: envs * T]
    assert first.eq(1.0).all() and x.eq(1.0).sum() == envs * T


def test_a_preempted_round_joined_along_time_is_not_padded() -> None:
    batch = assemble([share(1, 4), share(1, 1)], -1)
    assert list(batch.shape) == [5] and ("collector", "mask") not in batch.keys(True)
    stacked = assemble([share(1, 4), share(1, 1)], "stack")
    assert list(stacked.shape) == [2, 4]
    assert stacked["collector", "mask"].tolist() == [[True] * 4, [True, False, False, False]]


# -- end to end ------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("envs", [1, 2])
async def test_in_process_shape_equals_torchrl_collector(envs: int) -> None:
    pytest.importorskip("torchrl")
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import SerialEnv

    def torchrl_env():
        return make_torchrl_count_env() if envs == 1 else SerialEnv(envs, make_torchrl_count_env)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = TorchRLCollector(torchrl_env, make_policy(), frames_per_batch=8, total_frames=8)
        try:
            their_shape = [list(b.shape) for b in theirs]
        finally:
            theirs.shutdown()
    with anyio.fail_after(LIMIT):
        async with Collector(make_count_env, make_policy(), envs_per_worker=envs,
                             frames_per_batch=8, total_frames=8) as collector:
            our_shape = [list(b.shape) async for b in collector]
    assert our_shape == their_shape == [[8] if envs == 1 else [envs, 8 // envs]]


# Shapes do not depend on the event loop: these run once, through the blocking facade.
@pytest.mark.parametrize(("cat_results", "envs"), [("stack", 1), ("stack", 2), (0, 1),
                                                   (0, 2), (-1, 1), (-1, 2)])
def test_multi_sync_shapes(cat_results: object, envs: int) -> None:
    collector = MultiSyncCollector(make_count_env, num_workers=W, envs_per_worker=envs,
                                   frames_per_batch=W * envs * T, total_frames=W * envs * T,
                                   cat_results=cat_results)
    with BlockingCollector(collector) as c:
        shapes = [list(b.shape) for b in c]
    assert shapes == [SYNC[(cat_results, envs)]]


def test_multi_sync_default_is_torchrl_stack() -> None:
    collector = MultiSyncCollector(make_count_env, num_workers=W, envs_per_worker=2,
                                   frames_per_batch=W * 2 * T, total_frames=W * 2 * T)
    assert collector.cat_results == "stack"
    with BlockingCollector(collector) as c:
        batch = next(iter(c))
    assert list(batch.shape) == [W, 2, T]
    assert batch["collector", "worker_id"][:, 0, 0].tolist() == [0, 1]
    assert batch["next", "reward"].shape == (W, 2, T, 1)


@pytest.mark.parametrize("envs", [1, 2])
def test_multi_async_shapes(envs: int) -> None:
    collector = MultiAsyncCollector(make_count_env, num_workers=W, envs_per_worker=envs,
                                    frames_per_batch=envs * T, total_frames=2 * envs * T)
    with BlockingCollector(collector) as c:
        shapes = [list(b.shape) for b in c]
    assert shapes == [[T] if envs == 1 else [envs, T]] * 2
