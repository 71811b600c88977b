"""Run an example script as a user does: its own process and session, bounded, nothing left.

>>> alive_in_session(2 ** 22 + 1, grace=0)  # no such session
[]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(script: str, *argv: str, limit: float) -> subprocess.CompletedProcess[str]:
    """``python script *argv`` from the repository root in a session of its own; fails when it
    runs past ``limit`` seconds (killed with all it started) or leaves a process behind."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen([sys.executable, script, *argv],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"{script} did not finish within {limit} s:\n{out[-2000:]}"
                             ) from None
    left = alive_in_session(process.pid)
    if left:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"processes of {script} outlived it: {left}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


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
