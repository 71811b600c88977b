"""One hello, one admission, one command: an env worker's role.

Central inference's env workers say the same hello as a MultiCollector's workers,
with ``role="env"``; a trainer of the other kind refuses a hello of the wrong role
naming it (and what to start instead), whatever else the hello says. ``asyncrl worker
--role env`` runs an env worker (``asyncrl env-worker`` is its alias), and refuses the
options that only a rollout worker has, naming them.
"""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from asyncrl import AsyncBatchedCollector, MultiAsyncCollector
from asyncrl._protocol import PROTOCOL, Hello
from asyncrl.testing import CountingEnv, ValuePolicy
from tests.asyncrl.inference.test_batched_remote_env_hosts import hello as env_hello
from transports import Link

pytestmark = pytest.mark.anyio
LIMIT = 60


def test_a_hello_without_a_role_is_a_rollout_workers() -> None:
    # A worker before the field: it reads as what every peer then was.
    body = Hello(protocol=PROTOCOL, name="w", host="h", pid=1, specs={}).to_body()
    del body["role"]
    assert Hello.from_body(body).role == "rollout"
    assert Hello.from_body(env_hello([2])).role == "env"


async def test_a_rollout_worker_is_refused_by_central_inference_naming_the_role() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=ValuePolicy(1.0), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1) as collector:
            async with Link(collector.endpoint, identity=b"rollout",
                            heartbeat_interval=0.5) as link:
                rollout = Hello(protocol=PROTOCOL, name="w", host="h", pid=1, specs={})
                await link.send(rollout.to_body(), kind=Hello.KIND)
                answer = await link.recv()
            assert answer.kind == "refuse" and not answer.body["full"]
            assert ("role: this trainer runs an AsyncBatchedCollector (central inference)"
                    in answer.body["reason"])
            assert "'asyncrl worker --role env'" in answer.body["reason"]
            # the run goes on with its own env worker
            batch = await collector.__anext__()
            assert (batch["collector", "worker_id"] == 0).all()


async def test_an_env_worker_is_refused_by_a_multicollector_naming_the_role() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(
                CountingEnv, None, num_workers=0, remote_workers=1, frames_per_batch=8,
                listen="tcp://127.0.0.1:0", startup_timeout=None) as collector:
            async with Link(collector.endpoint, identity=b"env",
                            heartbeat_interval=0.5) as link:
                await link.send(env_hello([1]), kind=Hello.KIND)
                answer = await link.recv()
    assert answer.kind == "refuse" and not answer.body["full"]
    assert ("role: this trainer runs a MultiSyncCollector / MultiAsyncCollector"
            in answer.body["reason"])
    assert "this is an env worker (role 'env')" in answer.body["reason"]


def test_worker_role_env_refuses_the_options_of_a_rollout_worker() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl", "worker", "--role", "env", "--connect",
         "tcp://127.0.0.1:9", "--env", "CartPole-v1", "--policy", "pkg.mod:make",
         "--workers", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert ("asyncrl worker: --policy, --workers cannot apply to --role env: an env worker "
            "of central inference steps its envs only") in done.stderr


def test_env_worker_is_an_alias_that_says_so() -> None:
    done = subprocess.run([sys.executable, "-m", "asyncrl", "env-worker", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "An alias of 'asyncrl worker --role env'" in " ".join(done.stdout.split())
    done = subprocess.run([sys.executable, "-m", "asyncrl", "worker", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert "--role {rollout,env}" in done.stdout


async def test_an_env_worker_names_a_collector_of_the_older_join() -> None:
    # A trainer of the release before the one hello answers it with its own 'refused'.
    from asyncrl._errors import RefusedError
    from asyncrl._inference.remote_env_stepper import run_remote_env_worker
    from transports import Hub, Message

    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0", heartbeat_interval=0.5) as hub:
            async def old_collector() -> None:
                async for item in hub:
                    if isinstance(item, Message) and item.kind == Hello.KIND:
                        await hub.send(item.peer, "remote env worker refused: a remote env "
                                       "worker must first send 'env-hello', got 'hello'",
                                       kind="refused")
                        return

            async with anyio.create_task_group() as tg:
                tg.start_soon(old_collector)
                with pytest.raises(RefusedError, match="speaks the older join of env workers"):
                    await run_remote_env_worker(hub.endpoint, "asyncrl.testing:CountingEnv",
                                                join_timeout=30)
