"""Chaos: a training script read from stdin (``python - <<EOF``), as a user pastes one.

multiprocessing would run ``__main__.__file__`` (``'<stdin>'``) again in every
worker; the collector must start its workers without it, or say at construction
what cannot travel to them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import anyio
import pytest

from .helpers import LIMIT, Sandbox, sandbox_env

ASYNC = """
import anyio
from asyncrl import MultiSyncCollector

async def main():
    async with MultiSyncCollector({env!r}, num_workers=2, frames_per_batch=20,
                                  total_frames=60) as c:
        frames = [b.numel() async for b in c]
    print("frames", sum(frames), flush=True)

anyio.run(main, backend={backend!r})
"""

BLOCKING = """
from asyncrl import BlockingCollector, MultiAsyncCollector

with BlockingCollector(MultiAsyncCollector({env!r}, num_workers=2, frames_per_batch=20,
                                           total_frames=60, start_method="spawn"),
                       backend={backend!r}) as c:
    frames = [b.numel() for b in c]
print("frames", sum(frames), flush=True)
"""

OWN_FACTORY = """
import gymnasium as gym
from asyncrl import MultiSyncCollector

def make():
    return gym.make("CartPole-v1")

MultiSyncCollector(make, num_workers=2, frames_per_batch=20)
print("constructed", flush=True)
"""


def _run_stdin(sandbox: Sandbox, script: str) -> tuple[int, str, str]:
    process = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env=sandbox_env(sandbox),
                               cwd=sandbox.root)
    sandbox.watch(session=process.pid)
    try:
        out, err = process.communicate(script, timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate(timeout=LIMIT)
        raise AssertionError(f"the stdin script did not end within {LIMIT} s:\n{err}") from None
    return process.returncode, out, err


@pytest.mark.chaos
@pytest.mark.parametrize(("template", "env", "backend"), [
    (ASYNC, "CartPole-v1", "asyncio"),
    (BLOCKING, "gymnasium.envs.classic_control:CartPoleEnv", "trio")])
def test_a_script_from_stdin_runs_like_python_c(
        sandbox, template: str, env: str, backend: str) -> None:
    """A gym id or an import path needs nothing of ``__main__``: the run completes."""
    code, out, err = _run_stdin(sandbox, template.format(env=env, backend=backend))
    assert code == 0, err
    assert "frames 60" in out, out + err
    assert "FileNotFoundError" not in err and "WorkerLostError" not in err, err
    anyio.run(sandbox.assert_clean)


@pytest.mark.chaos
def test_a_factory_defined_in_a_stdin_script_is_refused_at_construction(sandbox) -> None:
    code, out, err = _run_stdin(sandbox, OWN_FACTORY)
    assert code == 1 and "constructed" not in out, out + err
    last = err.strip().splitlines()[-1]
    assert last.startswith("TypeError: create_env_fn uses 'make', defined in a script read "
                           "from stdin (`python -`)"), err
    assert "save it to a file and run that" in last and "'pkg.mod:factory'" in last, last
    anyio.run(sandbox.assert_clean)
