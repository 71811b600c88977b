"""Shared-memory batches in real collectors: same frames as the wire, no segment left behind.

Every local worker writes its batches into a segment the trainer made (one per
worker, ``/dev/shm/asyncrl_<trainer pid>_*``); with ``shared_memory_batches=False``
none is made. Frames are checked exactly (:func:`frame_identity_problems`: none
lost or repeated; :func:`version_problems`: each acted with its stamped weights).
"""

from __future__ import annotations

import glob
import os
import signal
import time
from typing import Any

import anyio
import pytest
from tensordict import TensorDictBase

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl.testing import (
    IdentityEnv,
    ValuePolicy,
    collect_with_updates,
    frame_identity_problems,
    identity_env,
    version_problems,
)

pytestmark = pytest.mark.anyio
LIMIT = 120  # spawns processes on 2 shared cores


def segments() -> set[str]:
    return set(glob.glob(f"/dev/shm/asyncrl_{os.getpid()}_*"))


def layout(batch: TensorDictBase) -> list[tuple[str, str, tuple[int, ...]]]:
    return sorted((str(k), str(v.dtype), tuple(v.shape))
                  for k, v in batch.items(include_nested=True, leaves_only=True))


async def run(collector_class: Any, shared: bool) -> tuple[list[Any], dict[int, Any], int]:
    """Batches, weight values and how many segments were alive during the run."""
    policy = ValuePolicy(0.0)
    async with collector_class(identity_env, policy, num_workers=2, envs_per_worker=2,
                               frames_per_batch=40, total_frames=320,
                               shared_memory_batches=shared) as collector:
        batches, values = await collect_with_updates(
            collector, policy, sync=collector_class is MultiSyncCollector)
        alive = len(segments())
    return batches, values, alive


@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
async def test_shared_batches_carry_the_same_frames_as_the_wire(collector_class: Any) -> None:
    before = segments()
    with anyio.fail_after(LIMIT):
        shared, shared_values, alive = await run(collector_class, True)
        wired, wired_values, none = await run(collector_class, False)
    assert (alive, none) == (2, 0)  # one segment per local worker, none when turned off
    assert segments() == before  # aclose() unlinked them
    for batches, values in ((shared, shared_values), (wired, wired_values)):
        assert sum(b.numel() for b in batches) == 320
        assert frame_identity_problems(batches, from_start=True) == []
        assert version_problems(batches, values) == []
    assert [layout(b) for b in shared] == [layout(b) for b in wired]


async def test_a_restarted_worker_gets_a_fresh_segment_and_the_dead_ones_is_unlinked() -> None:
    before = segments()
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(identity_env, ValuePolicy(0.0), num_workers=2,
                                      frames_per_batch=20, total_frames=400,
                                      on_worker_loss="restart") as c:
            batches = [await c.__anext__(), await c.__anext__()]  # the 2nd came through shm
            first = segments() - before
            old = c.worker_pids
            os.kill(old[1], signal.SIGKILL)
            async for batch in c:
                batches.append(batch)
                if len(batches) == 8:
                    break
            after = segments() - before
            new = c.worker_pids
    assert new[0] == old[0] and new[1] != old[1]
    assert len(first) == 2 and len(after) == 2 and len(first & after) == 1  # one replaced
    assert segments() == before
    assert frame_identity_problems(batches) == []
    assert all(b.numel() == 20 for b in batches)


class SlowIdentityEnv(IdentityEnv):
    """An :class:`IdentityEnv` whose step takes 5 ms: its worker is the straggler."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        time.sleep(0.005)
        return super().step(action)


def slow_env() -> SlowIdentityEnv:
    return SlowIdentityEnv()


async def test_preempted_shares_come_through_shared_memory_too() -> None:
    before = segments()
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector([identity_env, slow_env], ValuePolicy(0.0),
                                      num_workers=2, frames_per_batch=400, total_frames=-1,
                                      preemptive_threshold=0.5) as c:
            batches = []
            async for batch in c:
                batches.append(batch)
                if len(batches) == 4:
                    break
            alive = len(segments() - before)
    assert alive == 2
    cut = [b.get(("collector", "mask"))[1] for b in batches[1:]]  # the straggler's row
    assert all(not bool(row.all()) for row in cut), [int(row.sum()) for row in cut]
    kept = [b[b.get(("collector", "mask"))] if ("collector", "mask") in b.keys(True) else b
            for b in batches]  # the padding is no frame
    assert frame_identity_problems(kept) == []
    assert segments() == before


def test_a_dev_shm_too_small_for_the_slots_falls_back_to_the_wire_with_one_warning() -> None:
    from tests.transports.test_shm_full import in_small_shm

    result = in_small_shm("""
        import json, logging, os, anyio
        from asyncrl import MultiSyncCollector
        from tests.chaos.test_full_dev_shm import big_observation_env

        warnings = []
        handler = logging.Handler()
        handler.emit = lambda record: warnings.append(record.getMessage())
        handler.setLevel(logging.WARNING)
        logging.getLogger("asyncrl.coordinator").addHandler(handler)

        async def main():
            # Each worker's share: 4 frames x 2 x 2 MiB = 16 MiB a slot, 32 MiB a segment.
            async with MultiSyncCollector(big_observation_env, num_workers=2,
                                          frames_per_batch=8, total_frames=32) as c:
                return [b.numel() async for b in c]

        frames = anyio.run(main)
        print(json.dumps({"frames": frames, "warnings": warnings,
                          "left": [n for n in os.listdir("/dev/shm") if n.startswith("asyncrl")]}))
    """, size="24m", timeout=240)
    assert result["frames"] == [8, 8, 8, 8]
    shm_warnings = [w for w in result["warnings"] if "over the socket" in w]
    assert len(shm_warnings) == 1, result["warnings"]
    assert "/dev/shm is too small" in shm_warnings[0] and "--shm-size" in shm_warnings[0]
    assert result["left"] == []
