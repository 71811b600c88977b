"""Chaos: an env whose observations change dtype or shape mid-run (issue #22, item 7).

Worker 1's env returns float64 (or a wrong shape) from its 30th step on, where its
space says float32 ``(3,)``: the run fails with :class:`~asyncrl.SpecMismatchError`
naming the worker, the env, the key, what the spec says and what came, instead of
a silent cast or a bare numpy broadcast error.
"""

from __future__ import annotations

import anyio
import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector, SpecMismatchError
from asyncrl.testing import DriftingEnv

from .helpers import LIMIT, LIVENESS

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]


@pytest.mark.parametrize(("anyio_backend", "sync", "drift", "got"), [
    ("asyncio", True, "float64", "float64 of shape (3,)"),
    ("trio", False, "shape", "float32 of shape (4,)"),
])
async def test_an_observation_that_changes_dtype_or_shape_fails_the_run_naming_it(
        sandbox, sync: bool, drift: str, got: str) -> None:
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    with anyio.fail_after(LIMIT):
        async with cls(DriftingEnv, num_workers=2, frames_per_batch=20, total_frames=2_000,
                       create_env_kwargs=[{"at_step": 10**9}, {"at_step": 30, "drift": drift}],
                       **LIVENESS) as c:
            with pytest.raises(SpecMismatchError) as caught:
                async for _ in c:
                    pass
        await sandbox.assert_clean()
    message = str(caught.value)
    assert message.startswith(
        "worker 1, env 0: observation 'observation': the spec says float32 of shape (3,), "
        f"the env returned {got}"), message
