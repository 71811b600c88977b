"""A worker runs with the rollout options its welcome carries, and refuses a hostile map.

Against a scripted coordinator (a bare Hub, as tests/asyncrl/worker/test_worker_exits.py);
tests/multihost/test_rollout_options.py runs every option across a real host.
"""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl._protocol import Batch, Collect, Control, Hello, Welcome
from asyncrl._rollout.options import RolloutOptions
from asyncrl._spawn.exit_codes import EXIT_ERROR, EXIT_OK
from asyncrl._worker.spec import WorkerSpec
from asyncrl.testing import CountingEnv
from tests.asyncrl.worker.test_worker_exits import _next, _run_against
from transports import Hub

pytestmark = pytest.mark.anyio


async def _welcome(hub: Hub, rollout: dict[str, Any]) -> Hello:
    hello = Hello.from_body((await _next(hub, Hello.KIND)).body)
    await hub.send(b"w", Welcome(index=0, share_frames=6, attempt=hello.attempt,
                                 rollout=rollout).to_body(), kind=Welcome.KIND)
    return hello


async def test_a_worker_collects_with_the_options_of_its_welcome_not_its_own() -> None:
    seen: dict[str, Any] = {}
    own = RolloutOptions(policy_device="cpu")
    run = RolloutOptions(max_frames_per_traj=2, set_truncated=True)

    async def script(hub: Hub) -> None:
        seen["hello"] = await _welcome(hub, run.to_wire())
        await hub.send(b"w", Collect(request=1, credits=1).to_body(), kind=Collect.KIND)
        seen["batch"] = Batch.from_body((await _next(hub, Batch.KIND)).body).frames
        await hub.send(b"w", Control("close").to_body(), kind=Control.KIND)

    spec = WorkerSpec(CountingEnv, rollout=own)
    assert await _run_against(script, spec) == EXIT_OK
    assert seen["hello"].rollout == own.to_wire()  # what its own command line said
    frames = seen["batch"]
    assert frames["observation"][0, :, 0].tolist() == [0, 1, 0, 1, 0, 1]  # 2 frames a trajectory
    # Cut by the limit every 2nd frame; the last by set_truncated as well.
    assert frames["next", "truncated"][0, :, 0].tolist() == [False, True] * 3


async def test_a_welcome_with_a_hostile_rollout_map_ends_the_worker_naming_the_option() -> None:
    reports: list[Any] = []

    async def script(hub: Hub) -> None:
        await _welcome(hub, {"max_frames_per_traj": "5; rm -rf /"})
        reports.append((await _next(hub, "error")).body)

    assert await _run_against(script, WorkerSpec(CountingEnv)) == EXIT_ERROR
    assert "welcome rollout option max_frames_per_traj must be null (no limit) or an int" \
        in str(reports[0])
