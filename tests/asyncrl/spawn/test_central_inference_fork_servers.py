"""Central inference's fork servers (issue 45 item 2, memory): the torch-free one imports the
envs' modules once for every env worker; the one ``import asyncrl`` forks for per-worker
collectors is stopped when nothing in the process claimed it, and comes back when needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.asyncrl.spawn.test_early_fork_server import _wait_gone

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 120

# An env module whose top level notes every process that imports it; its factory notes
# the env worker that builds an env from it, and what that worker inherited.
ENV_MODULE = """
import gc, os, sys
with open(os.environ["NOTES"], "a") as f:
    f.write(f"import {os.getpid()}\\n")


def make():
    import gymnasium as gym
    with open(os.environ["NOTES"], "a") as f:
        f.write(f"make {os.getpid()} frozen={gc.get_freeze_count() > 0} "
                f"torch={'torch' in sys.modules}\\n")
    return gym.make("CartPole-v1")
"""

# Module level, as a script is: ``import asyncrl`` forks the per-worker fork server.
SCRIPT = """
import os
import anyio
import asyncrl
from multiprocessing import forkserver


def state(tag, first):
    now = forkserver._forkserver._forkserver_pid
    print(tag, first, now, os.path.exists(f"/proc/{first}"), flush=True)


async def batched(env):
    async with asyncrl.AsyncBatchedCollector([env] * 2, frames_per_batch=8,
                                             total_frames=8) as c:
        async for batch in c:
            print("BATCHED", list(batch.shape), *c.worker_pids, flush=True)


async def per_worker():
    async with asyncrl.MultiSyncCollector("CartPole-v1", num_workers=1, frames_per_batch=8,
                                          total_frames=8) as c:
        async for batch in c:
            print("PER-WORKER", list(batch.shape), flush=True)


if __name__ == "__main__":
    import sys
    first = forkserver._forkserver._forkserver_pid
    print("TRAINER", os.getpid(), flush=True)
    for step in sys.argv[1].split(","):
        anyio.run(batched if step == "batched" else per_worker,
                  *(["envmod:make"] if step == "batched" else []))
        state("AFTER-" + step.upper(), first)
"""


def _run(tmp_path: Path, order: str) -> tuple[list[list[str]], str]:
    (tmp_path / "envmod.py").write_text(ENV_MODULE)
    (tmp_path / "script.py").write_text(SCRIPT)
    notes = tmp_path / "notes.txt"
    env = {**os.environ, "NOTES": str(notes),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    out = subprocess.run([sys.executable, str(tmp_path / "script.py"), order],
                         capture_output=True, text=True, timeout=LIMIT, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return [line.split() for line in out.stdout.splitlines()], notes.read_text()


def _line(lines: list[list[str]], tag: str) -> list[str]:
    return next(line for line in lines if line[0] == tag)


def test_env_workers_share_their_envs_module_imported_once_by_the_torch_free_server(
        tmp_path: Path) -> None:
    lines, notes = _run(tmp_path, "batched")
    batched = _line(lines, "BATCHED")
    assert batched[1] == "[8]", lines
    workers = set(batched[2:])
    assert len(workers) == 2, lines
    imports = [line.split()[1] for line in notes.splitlines() if line.startswith("import")]
    makes = [line.split() for line in notes.splitlines() if line.startswith("make")]
    # Imported by the trainer (it builds one env for the layouts) and once for every env
    # worker, by the torch-free fork server (none of them); each env worker built its env
    # from it, inheriting it frozen, without torch.
    trainer = _line(lines, "TRAINER")[1]
    assert len(imports) == 2 and imports[0] == trainer, (imports, trainer)
    assert imports[1] not in workers | {trainer}, (imports, workers)
    in_workers = [make for make in makes if make[1] != trainer]
    assert {make[1] for make in in_workers} == workers, (makes, workers)
    assert all(make[2:] == ["frozen=True", "torch=False"] for make in in_workers), makes


def test_central_inference_alone_stops_the_unused_fork_server_and_a_per_worker_collector_after_it_starts_one(  # noqa: E501
        tmp_path: Path) -> None:
    lines, _ = _run(tmp_path, "batched,per-worker")
    _, first, now, alive = _line(lines, "AFTER-BATCHED")
    assert first != "None", "the fork server was not started at import"
    # Stopped and reaped (its /proc entry gone), forgotten by multiprocessing.
    assert (now, alive) == ("None", "False"), lines
    assert _line(lines, "PER-WORKER")[1:] == ["[1,", "8]"], lines
    _, _, now, _ = _line(lines, "AFTER-PER-WORKER")
    assert now not in ("None", first), lines  # a fork server of its own, started for it
    assert _wait_gone(int(now)), f"fork server {now} outlived the script"


def test_a_fork_server_a_per_worker_collector_used_is_kept(tmp_path: Path) -> None:
    lines, _ = _run(tmp_path, "per-worker,batched")
    _, first, now, alive = _line(lines, "AFTER-BATCHED")
    assert (now, alive) == (first, "True"), lines
