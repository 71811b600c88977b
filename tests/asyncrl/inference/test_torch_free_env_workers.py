"""Env workers of central inference run without torch and tensordict (issue #45, item 2).

A local env worker steps envs and moves numpy arrays through shared memory; it
is forked from a fork server of its own started with ``ASYNCRL_TORCH_FREE=1``
(``asyncrl._spawn.torch_free``), not from the one forked at ``import asyncrl``,
which holds torch. What a user relies on: the same frames as before, from
processes that import neither.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import torch

from asyncrl import AsyncBatchedCollector
from asyncrl._spawn.torch_free import start_torch_free
from tests.asyncrl.worker_hosts import ROOT, wait_exit

pytestmark = pytest.mark.anyio
LIMIT = 90

#: Run in the child: what it imported once the env worker's entry module is in.
REPORT = """
import json, sys
import asyncrl._inference.env_worker
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tensordict"))
with open({path!r}, "w") as f:
    json.dump({{"heavy": heavy, "entry": "asyncrl._inference.env_worker" in sys.modules,
               "main": getattr(sys.modules.get("__mp_main__"), "__file__", None)}}, f)
"""


def _start_and_wait(code: str, method: str) -> int | None:
    process = mp.get_context(method).Process(target=exec, args=(code,))
    start_torch_free(process)
    process.join(60)
    return process.exitcode


# forkserver: the torch-free fork server; spawn: the fallback when it cannot start one.
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
async def test_the_local_env_worker_entry_imports_neither_torch_nor_tensordict(
        tmp_path: Path, method: str) -> None:
    report = tmp_path / "modules.json"
    with anyio.fail_after(LIMIT):
        code = await anyio.to_thread.run_sync(
            _start_and_wait, REPORT.format(path=str(report)), method)
    assert code == 0
    seen = json.loads(report.read_text())
    assert seen["heavy"] == [], f"a torch-free env worker imported {seen['heavy']}"
    assert seen["entry"] is True
    # The child's main module is the marker script, not this test run's.
    assert seen["main"].endswith("asyncrl/_spawn/torch_free_main.py")


def _maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


async def test_local_env_workers_of_named_envs_hold_no_torch_and_collect_every_frame() -> None:
    frames = []
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(["CartPole-v1"] * 2, frames_per_batch=40,
                                         total_frames=120) as collector:
            async for batch in collector:
                frames.append(batch)
                pids = collector.worker_pids
                assert len(pids) == 2
                assert not any(_maps_torch(pid) for pid in pids)
    data = torch.cat(frames, 0)
    assert data.numel() == 120
    assert set(data["collector", "worker_id"].tolist()) <= {0, 1}
    assert data["observation"].dtype == torch.float32 and data["observation"].shape == (120, 4)
    # Within a trajectory, each step's observation is the previous step's next one.
    for tid in data["collector", "traj_ids"].unique().tolist():
        traj = data[data["collector", "traj_ids"] == tid]
        assert torch.equal(traj["observation"][1:], traj["next", "observation"][:-1])
        done = traj["next", "done"].view(-1)
        assert not done[:-1].any()  # an episode that ended starts a new trajectory


async def test_env_workers_of_a_callable_are_forked_with_torch_as_before() -> None:
    # A callable may come from the user's script, which a torch-free child never runs.
    import gymnasium as gym

    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector([functools.partial(gym.make, "CartPole-v1")],
                                         frames_per_batch=20, total_frames=20) as collector:
            async for _ in collector:
                assert all(_maps_torch(pid) for pid in collector.worker_pids)


def _modules_of_env_worker_command(tmp_path: Path) -> list[str]:
    """What ``asyncrl env-worker`` imports, up to its first try to join (none listens)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "asyncrl", "env-worker", "--connect",
         "tcp://127.0.0.1:9", "--env", "CartPole-v1", "--join-timeout", "0.5"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert result.returncode == 5, result.stderr[-2000:]  # no welcome within --join-timeout
    return [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
            if line.startswith("import time:") and "|" in line]


def test_the_remote_env_worker_command_imports_neither_torch_nor_tensordict(
        tmp_path: Path) -> None:
    modules = _modules_of_env_worker_command(tmp_path)
    assert "asyncrl._inference.remote_env_stepper" in modules  # it got that far
    assert "gymnasium" in modules  # and built its envs
    assert [m for m in modules if m.split(".")[0] in ("torch", "tensordict")] == []


async def test_a_torch_free_remote_env_worker_collects_every_frame() -> None:
    frames = []
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector("CartPole-v1", num_envs=0, frames_per_batch=32,
                                         total_frames=96, listen="tcp://127.0.0.1:0",
                                         remote_workers=1) as collector:
            host = subprocess.Popen(
                [sys.executable, "-m", "asyncrl", "env-worker", "--connect", collector.endpoint,
                 "--env", "CartPole-v1", "--envs", "2"], stderr=subprocess.PIPE, text=True,
                env=dict(os.environ,
                         PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
            try:
                async for batch in collector:
                    frames.append(batch)
                    assert not _maps_torch(host.pid)
            finally:
                await collector.aclose()
                code, err = await wait_exit(host)
    assert code == 0, err
    data = torch.cat(frames, 0)
    assert data.numel() == 96 and data["observation"].shape == (96, 4)
    for tid in data["collector", "traj_ids"].unique().tolist():
        traj = data[data["collector", "traj_ids"] == tid]
        assert torch.equal(traj["observation"][1:], traj["next", "observation"][:-1])


def test_a_torch_free_codec_takes_tensors_as_arrays_and_refuses_tensordicts() -> None:
    from tensordict import TensorDict

    from transports import encode

    tensor_frames = encode({"a": torch.arange(3, dtype=torch.int16)})
    td_frames = encode(TensorDict({"x": torch.zeros(2)}, [2]))
    blobs = [[bytes(memoryview(f)) for f in frames] for frames in (tensor_frames, td_frames)]
    code = """
import sys, pickle
from transports import decode, ProtocolError
assert "torch" not in sys.modules
tensors, td = pickle.loads(sys.stdin.buffer.read())
out = decode(tensors)["a"]
print(type(out).__name__, out.dtype, out.tolist())
try:
    decode(td)
except ProtocolError as exc:
    print("refused:", exc)
assert "torch" not in sys.modules and "tensordict" not in sys.modules
"""
    result = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(blobs),
                            capture_output=True, timeout=60,
                            env={**os.environ, "ASYNCRL_TORCH_FREE": "1"})
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "ndarray int16 [0, 1, 2]"
    assert lines[1] == ("refused: a TensorDict came to a torch-free process (an env worker): "
                        "it takes numpy arrays and msgpack values only")
