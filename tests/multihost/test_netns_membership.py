"""Elastic membership between two network namespaces: a departure, and a kill + replacement.

The chaos scenarios of tests/chaos/test_membership.py, over a real link: the trainer
(elastic_trainer.py) in one namespace, ``asyncrl worker`` hosts in the other, joined
by a veth pair. A host stopped with SIGTERM leaves (a departure, even under
``on_worker_loss="raise"``); a killed worker is lost on its closed connection
(``peer_timeout`` is 120 s) and a new host takes its place with the latest
weights. Each run checks every frame once (``frame_identity_problems``), each
acted with the weights of its stamped version (``version_problems``), and the
exact total. The namespaces are deleted afterwards, and checked gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multihost.lines import Lines
from tests.multihost.netns import two_namespaces

TRAINER = Path(__file__).parent / "elastic_trainer.py"
TOTAL = 400  # elastic_trainer.TOTAL


@pytest.fixture
def hosts_ns() -> Iterator[dict[str, str]]:
    with two_namespaces("arle") as ns:
        yield ns


def start_host(ns: dict[str, str], env: dict[str, str]) -> subprocess.Popen:
    # `ip netns exec` execs the command: the Popen's pid is the host's own
    return subprocess.Popen(
        ["ip", "netns", "exec", ns["worker"], sys.executable, "-m", "asyncrl.cli", "worker",
         "--connect", f"tcp://{ns['addr']}:5555", "--env", "asyncrl.testing:IdentityEnv",
         "--policy", "asyncrl.testing:ValuePolicy", "--peer-timeout", "1.5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def start_trainer(ns: dict[str, str], scenario: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns["coord"], sys.executable, str(TRAINER),
         f"tcp://{ns['addr']}:5555", scenario],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env)


def check_run(done: dict, sizes: list[int]) -> None:
    assert done["problems"] == [], done["problems"][:20]
    assert done["frames"] == TOTAL  # exact
    assert done["sizes"] == sizes  # whole shares of 10 frames, never half of one


def test_a_host_stopped_with_sigterm_departs_across_the_link(hosts_ns) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    trainer = start_trainer(hosts_ns, "depart", env)
    hosts: list[subprocess.Popen] = []
    try:
        lines = Lines(trainer)
        lines.until(lambda e: e["event"] == "listening", 90)
        hosts = [start_host(hosts_ns, env) for _ in range(2)]
        assert trainer.stdin is not None
        trainer.stdin.write(f"hosts {hosts[0].pid} {hosts[1].pid}\n")
        trainer.stdin.flush()
        done = lines.until(lambda e: e["event"] == "done", 180)
        codes = [h.wait(timeout=60) for h in hosts]
        assert trainer.wait(timeout=60) == 0
    finally:
        for process in [trainer, *hosts]:
            if process.poll() is None:
                process.kill()  # a host's workers follow it (pidfd watch)
    assert codes == [0, 0], [h.stdout.read() for h in hosts if h.stdout]
    check_run(done, [10, 20])  # one share per live worker: 10 frames once one has left
    kinds = [kind for kind, _ in done["membership"]]
    assert kinds.count("left") == 1 and "lost" not in kinds, done["membership"]
    assert done["states"].count("left") == 1, done["states"]


def test_a_killed_worker_is_lost_at_once_and_a_new_host_takes_its_place(hosts_ns) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    trainer = start_trainer(hosts_ns, "kill", env)
    hosts: list[subprocess.Popen] = []
    try:
        lines = Lines(trainer)
        lines.until(lambda e: e["event"] == "listening", 90)
        hosts = [start_host(hosts_ns, env) for _ in range(2)]
        lines.until(lambda e: e["event"] == "replace", 180)
        hosts.append(start_host(hosts_ns, env))
        done = lines.until(lambda e: e["event"] == "done", 180)
        assert trainer.wait(timeout=60) == 0
        for host in hosts:
            host.wait(timeout=60)
    finally:
        for process in [trainer, *hosts]:
            if process.poll() is None:
                process.kill()
    check_run(done, [20])  # the round waited for the newcomer's share: never smaller
    lost = [reason for kind, reason in done["membership"] if kind == "lost"]
    assert len(lost) == 1 and "closed its connection" in lost[0], done["membership"]
    assert [kind for kind, _ in done["membership"]].count("joined") == 3
    # the replacement delivered frames after the fault (each acted with its version)
    fresh = set(done["pids_after"]) - set(done["faulted"])
    assert fresh and hosts[2].returncode == 0, (done, hosts[2].stdout.read()
                                                 if hosts[2].stdout else "")
