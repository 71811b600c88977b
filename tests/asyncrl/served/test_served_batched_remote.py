"""AsyncBatchedCollector's remote env hosts call a served module over their link."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import torch

from asyncrl import AsyncBatchedCollector
from asyncrl.served import ServedModule

from .served_envs import REMOTE_NAME, Scale, rewarded_env

pytestmark = pytest.mark.anyio
ROOT = str(Path(__file__).resolve().parents[3])


def start_env_host(endpoint: str, backend: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--role", "env", "--connect", endpoint,
         "--env", "tests.asyncrl.served.served_envs:remote_rewarded_env",
         "--envs-per-worker", "2", "--backend", backend],
        env=env, stderr=subprocess.PIPE, text=True)


async def test_a_remote_env_host_calls_the_module_and_sees_its_updates(
        anyio_backend: str) -> None:
    served = ServedModule(Scale(2.0), name=REMOTE_NAME,
                          example={"next_observation": torch.zeros(3)}, clients=4)
    with anyio.fail_after(120):
        async with served:
            collector = AsyncBatchedCollector(
                functools.partial(rewarded_env, served.handle), num_envs=0,
                frames_per_batch=16, listen="tcp://127.0.0.1:0", remote_workers=1)
            async with collector:
                host = start_env_host(collector.endpoint, anyio_backend)
                try:
                    scales = []
                    async for batch in collector:
                        assert (batch["collector", "worker_id"] == 0).all()  # the host's slot
                        t = batch["next", "observation"][..., 0]
                        reward = batch["next", "reward"].squeeze(-1)
                        # every frame's reward is t times the scale of one version
                        ratio = {round(float(r / s), 6) for r, s in zip(reward, t, strict=True)
                                 if s != 0}
                        assert len(ratio) <= 2 and ratio <= {2.0, 5.0}, ratio
                        scales.append(ratio)
                        if len(scales) == 1:
                            await collector.update_policy_weights(
                                {"scale": torch.tensor([5.0])}, model_id=REMOTE_NAME)
                        elif ratio == {5.0}:
                            break
                    assert scales[0] == {2.0}
                finally:
                    await collector.aclose()
                    with anyio.fail_after(30):
                        code = await anyio.to_thread.run_sync(host.wait)
                    assert host.stderr is not None
                    err = host.stderr.read()
            assert code == 0, err
            assert collector.remote_refusals == []
            assert served.version == 1
