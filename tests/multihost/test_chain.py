"""Weights along a gloo chain across hosts: two worker hosts (namespaces) on one switch.

The trainer (a third namespace, with the switch) broadcasts with
``DistributedWeightSyncScheme(algorithm="chain")``. The workers join interleaved (host
A, host B twice, host A again), so their indices alternate between hosts: the chain
must still visit each host's workers one after the other. Every frame carries the
weights of its version.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from tests.multihost.lines import Lines
from tests.multihost.netns import switched_namespaces

TRAINER = Path(__file__).parent / "chain_trainer.py"
WORKERS = 4


def test_the_chain_crosses_each_host_once_and_every_frame_has_its_weights(tmp_path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # stderr apart: torch.distributed's own warnings would land inside the JSON lines
    stderr = (tmp_path / "trainer.err").open("w")
    with switched_namespaces("arc-", 2) as net, stderr:
        addr = net["addr"]
        a, b = net["workers"]  # type: ignore[misc]
        trainer = subprocess.Popen(
            ["ip", "netns", "exec", str(net["coord"]), sys.executable, str(TRAINER),
             f"tcp://{addr}:5561", f"tcp://{addr}:5562", str(WORKERS)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        hosts: list[subprocess.Popen] = []

        def start(ns: str, workers: int) -> None:
            hosts.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "asyncrl.cli", "worker",
                 "--connect", f"tcp://{addr}:5561", "--env", "asyncrl.testing:CountingEnv",
                 "--policy", "asyncrl.testing:ValuePolicy", "--workers", str(workers)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))

        try:
            lines = Lines(trainer)
            lines.until(lambda e: e["event"] == "listening", 60)
            # indices 0 (A), 1 and 2 (B), 3 (A): each worker's rank is its index + 1
            for ns, workers, joined in ((a, 1, 1), (b, 2, 3), (a, 1, 4)):
                start(ns, workers)
                lines.until(lambda e, n=joined: e["event"] == "joined" and e["workers"] >= n,
                            90)
            done = lines.until(lambda e: e["event"] == "done", 240)
            assert trainer.wait(60) == 0, (tmp_path / "trainer.err").read_text()[-3000:]
        finally:
            for process in (trainer, *hosts):
                if process.poll() is None:
                    process.kill()
                process.wait(30)
    assert done["problems"] == []
    assert len(done["versions"]) >= 3
    where = {int(index): ns for index, ns in done["hosts"].items()}
    assert where == {0: a, 1: b, 2: b, 3: a}  # the joins interleaved the hosts
    order = done["order"]
    assert order == [0, 1, 4, 2, 3]  # host A's ranks, then host B's
    path = [where[rank - 1] for rank in order[1:]]
    assert [ns for ns, _ in itertools.groupby(path)] == [a, b]  # each host crossed once
