"""Off-policy use (issue #27, item 4): the UTD ratio and the ported SAC example."""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from asyncrl import UpdateRatio

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 300


@pytest.mark.parametrize(("ratio", "start_after", "batches"), [
    (0.25, 0, [200] * 5), (0.1, 0, [7, 13, 3, 77]), (2, 50, [30, 30, 30]),
    (Fraction(1, 3), 10, [1] * 40),
])
def test_update_ratio_is_exact_whatever_the_batches(ratio: float, start_after: int,
                                                   batches: list[int]) -> None:
    utd = UpdateRatio(ratio, start_after=start_after)
    frames = 0
    for size in batches:
        frames += size
        taken = len(utd.take(frames))
        assert utd.updates == max(0, int((frames - start_after) * Fraction(ratio)
                                         .limit_denominator(1_000_000)))
        assert taken >= 0 and utd.due(frames) == 0


def test_update_ratio_most_and_refusals() -> None:
    utd = UpdateRatio(1.0)
    assert len(utd.take(10, most=4)) == 4 and utd.due(10) == 6  # the rest stays due
    assert len(utd.take(10)) == 6 and utd.updates == 10
    assert utd.allowed(3) == 3 and utd.due(3) == 0  # never negative
    with pytest.raises(ValueError, match=r"must be positive"):
        UpdateRatio(0)
    with pytest.raises(ValueError, match=r"start_after=-1"):
        UpdateRatio(1, start_after=-1)
    assert repr(UpdateRatio(0.5, start_after=2)) == "UpdateRatio(0.5, start_after=2, updates=0)"


def test_the_sac_example_trains_on_a_tiny_budget() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "examples/sac_pendulum.py", "--total-frames", "600",
         "--frames-per-batch", "100", "--init-random-frames", "200", "--utd", "0.25",
         "--batch-size", "32"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=LIMIT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln.split() for ln in done.stdout.splitlines() if ln.endswith(("updates", ")"))
             or "updates  return" in ln]
    progress = [(int(ln[1]), int(ln[3])) for ln in lines if ln[2] == "frames"]
    # exactly floor((frames - 200) * 0.25) updates after each batch: none while warming up
    assert progress == [(f, max(0, (f - 200) // 4)) for f in range(100, 700, 100)]
    assert "asyncrl: 600 frames, 100 updates in" in done.stdout
