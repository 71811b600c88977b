"""The trainer's rollout options reach a real remote host (``asyncrl worker`` over tcp).

Before, a host built its options from its own command line and the welcome carried
none: ``max_frames_per_traj=5`` gave a remote worker 67-step trajectories. One trainer
here sets every travelling option away from its default at once (see
tests/multihost/rollout_probe.py), and each leaves its own mark in the batch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from asyncrl import MultiSyncCollector
from asyncrl._rollout.options import RolloutOptions, wire_fields
from tests.multihost.processes import wait_exit
from tests.multihost.rollout_probe import OPTIONS, make_env

pytestmark = pytest.mark.anyio
LIMIT = 120
ROOT = Path(__file__).parents[2]
PROBE = "tests.multihost.rollout_probe"


def host(endpoint: str, *flags: str) -> subprocess.Popen[str]:
    """``asyncrl worker`` with the probe's env and policy, from the repository root."""
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint,
         "--env", f"{PROBE}:make_env", "--policy", f"{PROBE}:make_policy", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def collector(workers: int = 1, **options: object) -> MultiSyncCollector:
    return MultiSyncCollector(make_env, None, num_workers=0, remote_workers=workers,
                              listen="tcp://127.0.0.1:0", frames_per_batch=8 * workers,
                              total_frames=16 * workers, **options)  # type: ignore[arg-type]


def test_the_probe_sets_every_travelling_option_away_from_its_default() -> None:
    ours, defaults = RolloutOptions(**OPTIONS).to_wire(), RolloutOptions().to_wire()
    assert [name for name in wire_fields() if ours[name] == defaults[name]] == [
        "reset_when_done"]  # its only other value is refused: the rollout always resets


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # processes: once is enough
async def test_every_rollout_option_reaches_a_remote_host_and_shows_in_its_batches() -> None:
    # Two workers: they join through the host's relay (weights) and each is welcomed.
    with anyio.fail_after(LIMIT):
        async with collector(2, **OPTIONS) as c:
            worker = host(c.endpoint, "--workers", "2")
            try:
                batches = [b.clone() async for b in c]
            except BaseException:
                worker.kill()
                raise
        code = await wait_exit(worker)
    output = worker.stdout.read() if worker.stdout else ""
    assert code == 0, output
    assert len(batches) == 2
    counts = [0, 1, 2, 3, 4, 0, 1, 2]
    for batch in batches:
        assert batch.batch_size == (2, 8)
        assert sorted(batch["collector", "worker_id"][:, 0].tolist()) == [0, 1]
        for row in batch.unbind(0):
            # max_frames_per_traj=5 cuts the never-ending episode after 5 frames, and
            # reset_at_each_iter starts each batch afresh (without it: 3, 4, 0, 1, ...).
            assert row["count"][:, 0].tolist() == counts
            traj = row["collector", "traj_ids"].tolist()
            assert len(set(traj[:5])) == 1 and len(set(traj[5:])) == 1 and traj[0] != traj[5]
            # set_truncated: the batch's last frame is truncated too (the limit: frame 4).
            truncated = [i in (4, 7) for i in range(8)]
            assert row["next", "truncated"][:, 0].tolist() == truncated
            assert row["next", "done"][:, 0].tolist() == truncated
            assert not row["next", "terminated"].any()
            # exploration_type="mode": the policy saw it.
            assert row["mode"].eq(1).all()
            # policy_in_keys=["count"], policy_method="act", policy_out_keys=[seen, action, mode].
            assert row["seen"][:, 0].tolist() == [10.0 * c for c in counts]
            # info_keys=["t"]: the step's info.
            assert row["next", "t"].tolist() == [c + 1 for c in counts]
    # reset_at_each_iter: every batch starts new trajectories.
    firsts = [set(b["collector", "traj_ids"][:, 0].tolist()) for b in batches]
    assert not firsts[0] & firsts[1]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # processes: once is enough
async def test_a_host_flag_that_differs_from_the_trainers_option_is_refused_naming_both() -> None:
    with anyio.fail_after(LIMIT):
        async with collector(info_keys=["t"]) as c:
            worker = host(c.endpoint, "--info-key", "other.t")
            code = await wait_exit(worker)
    output = worker.stdout.read() if worker.stdout else ""
    assert code == 4, output  # refused
    assert ("rollout option info_keys: this host was started with [[['other', 't'], None]] "
            "and the trainer's is [[['t'], None]]") in output, output
