"""AsyncBatchedCollector's remote env hosts call a served module over their link."""

from __future__ import annotations

import functools
import subprocess

import anyio
import numpy as np
import pytest
import torch

from asyncrl import AsyncBatchedCollector
from asyncrl._protocol import PROTOCOL, EnvLayout, Hello, ServedCall
from asyncrl.served import ServedModule
from tests.asyncrl.worker_hosts import env_host, wait_exit
from transports import Link

from .served_envs import REMOTE_NAME, Scale, rewarded_env, served_refusal

pytestmark = pytest.mark.anyio


def start_env_host(endpoint: str, backend: str) -> subprocess.Popen[str]:
    return env_host(endpoint, "tests.asyncrl.served.served_envs:remote_rewarded_env", backend)


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
                    code, err = await wait_exit(host)
            assert code == 0, err
            assert collector.remote_refusals == []
            assert served.version == 1


def env_hello() -> dict[str, object]:
    """The one hello of an env worker with one StepEnv (float32[3], Discrete(2))."""
    layout = EnvLayout(envs=1, obs=[("float32", [3])], action=("int64", []))  # type: ignore[list-item]
    return Hello(protocol=PROTOCOL, name="test", host="test-host", pid=1, role="env",
                 specs=layout.to_specs()).to_body()


async def test_a_hosts_calls_are_checked_and_a_strangers_refused() -> None:
    served = ServedModule(Scale(2.0), name=REMOTE_NAME,
                          example={"next_observation": torch.zeros(3)}, clients=4)
    with anyio.fail_after(120):
        async with served, AsyncBatchedCollector(
                functools.partial(rewarded_env, served.handle), num_envs=1,
                frames_per_batch=8, listen="tcp://127.0.0.1:0", remote_workers=1) as collector:
            events = collector.events()
            async with Link(collector.endpoint, identity=b"stranger",
                            heartbeat_interval=0.5) as stranger:
                await stranger.send(ServedCall(REMOTE_NAME, 1, {
                    "next_observation": np.ones(3, np.float32)}).to_body(), kind="served_call")
                answer = await stranger.recv()
            assert answer.kind == "refuse"  # not admitted: never reaches the module
            assert "must first send 'hello' (role 'env'), got 'served_call'" in \
                answer.body["reason"]

            async with Link(collector.endpoint, identity=b"host",
                            heartbeat_interval=0.5) as host:
                await host.send(env_hello(), kind="hello")
                welcome = await host.recv()
                assert welcome.kind == "env_welcome"
                assert welcome.body["served"] == [{
                    "name": REMOTE_NAME, "inputs": [["next_observation", "float32", [3]]],
                    "output": ["output", "float32", [1]], "call_timeout": 10.0}]
                await host.send(ServedCall(REMOTE_NAME, 7, {
                    "next_observation": np.full(3, 3.0, np.float32)}).to_body(),
                    kind="served_call")
                good = await host.recv()
                await host.send(ServedCall(REMOTE_NAME, 8, {
                    "next_observation": np.ones(4, np.float64)}).to_body(), kind="served_call")
                bad = await host.recv()
                await host.send(ServedCall("env.transform[9]", 9, {
                    "next_observation": np.ones(3, np.float32)}).to_body(), kind="served_call")
                unknown = await host.recv()
            assert good.kind == "served_answer"
            assert (good.body["call"], good.body["version"]) == (7, 0)
            assert "error" not in good.body  # (an answer with an output has none)
            assert np.asarray(good.body["output"]).tolist() == [6.0]
            assert bad.body["call"] == 8 and bad.body["error"].startswith("refused: ")
            assert "float64[4]" in bad.body["error"]
            assert unknown.body["error"] == (
                "refused: served_call names module 'env.transform[9]'; this run serves "
                "['env.transform[0]'] (the served modules open in the trainer's process as "
                "the collector opened)")
            assert collector.statistics().served_refusals == {"malformed": 1,
                                                              "unknown module": 1}
            refused = await served_refusal(events)
            assert (refused.name, refused.reason.split(":")[0]) == (
                "host", "served_call refused (malformed)")
            # the local worker's frames keep coming, rewarded by the module
            batch = await collector.__anext__()
            t = batch["next", "observation"][..., 0]
            assert torch.equal(batch["next", "reward"].squeeze(-1), 2 * t)
