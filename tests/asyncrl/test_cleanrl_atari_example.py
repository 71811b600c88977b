"""examples/cleanrl_ppo_atari.py, CleanRL's PPO on Breakout frames, runs as a user runs it.

Learning Breakout takes millions of frames, far beyond a test's budget: this checks that
the script collects real Atari batches in worker processes, trains on them, sends the
weights back and ends cleanly, with the numbers a user reads.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from tests.asyncrl.example_runs import run_script

pytest.importorskip("ale_py")
pytest.importorskip("cv2")  # gymnasium's AtariPreprocessing resizes with OpenCV

LIMIT = 300  # a bound, not a speed claim: about 15 s on 2 quiet cores


def run_example(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_script("examples/cleanrl_ppo_atari.py", *argv, limit=LIMIT)


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
