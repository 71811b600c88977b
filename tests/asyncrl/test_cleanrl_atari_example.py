"""examples/cleanrl_ppo_atari.py, CleanRL's PPO on Breakout frames, runs as a user runs it.

Learning Breakout takes millions of frames, far beyond a test's budget: this checks that
the script collects real Atari batches in worker processes, trains on them, sends the
weights back and ends cleanly, with the numbers a user reads.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ale_py")
pytest.importorskip("cv2")  # gymnasium's AtariPreprocessing resizes with OpenCV

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 300  # a bound, not a speed claim: about 15 s on 2 quiet cores


def alive_in_session(sid: int, grace: float = 10.0) -> list[str]:
    """Live processes of session ``sid`` (zombies left for init to reap do not count), polled
    for ``grace`` seconds: empty when the run left nothing behind."""
    deadline = time.monotonic() + grace
    while True:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...
            if int(fields[3]) == sid and fields[0] != "Z":
                left.append(f"{pid} {stat[stat.index('(') + 1:stat.rindex(')')]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def run_example(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen([sys.executable, "examples/cleanrl_ppo_atari.py", *argv],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"the example did not finish within {LIMIT} s:\n{out[-2000:]}"
                             ) from None
    left = alive_in_session(process.pid)
    if left:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"processes of the example outlived it: {left}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_the_atari_example_trains_on_worker_batches_and_ends_cleanly() -> None:
    done = run_example("--total-timesteps", "1536", "--num-steps", "64", "--num-workers", "2",
                       "--num-envs", "4", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # 2 workers x 4 envs x 64 steps per batch, three batches
    assert [line.split(" ")[:2] for line in lines[:3]] == [
        ["iteration=1/3", "global_step=512"], ["iteration=2/3", "global_step=1024"],
        ["iteration=3/3", "global_step=1536"]]
    result = json.loads(lines[-1])
    assert result["frames"] == 1536
    assert math.isfinite(result["policy_loss"]) and math.isfinite(result["value_loss"])
    assert result["value_loss"] > 0  # clipped rewards reached the critic's targets
    if result["episodes"]:  # raw Breakout scores: whole bricks, never negative
        assert result["last_returns_mean"] >= 0


def test_a_budget_smaller_than_one_batch_says_so() -> None:
    done = run_example("--total-timesteps", "100", "--num-steps", "64", "--json")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "--total-timesteps 100 is less than one batch (512 frames: --num-workers 2 x "
        "--num-envs 4 x --num-steps 64): raise it or lower those"), done.stderr[-2000:]
