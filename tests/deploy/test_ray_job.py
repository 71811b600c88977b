"""examples/ray_job.py, the entrypoint of deploy/kuberay/rayjob.yaml, on a local Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

from transports import generate_keys

ROOT = Path(__file__).resolve().parents[2]
# One local Ray cluster at a time: tests/multihost/test_launch_ray.py's shares the group.
pytestmark = pytest.mark.xdist_group("ray")


def test_the_ray_job_collects_with_a_worker_host_per_node(tmp_path: Path) -> None:
    keys = generate_keys(tmp_path / "keys")  # both roles' files: one node plays both
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "examples.ray_job", "--local-cpus", "2", "--workers-per-host",
         "2", "--frames-per-batch", "200", "--total-frames", "400", "--port", "0",
         "--advertise", "127.0.0.1", "--keys", str(keys)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=220,
        start_new_session=True)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "examples.ray_job: ready: 2 workers on 1 Ray nodes joined tcp://127.0.0.1:" in output
    assert "done: host exit codes [0]" in output
