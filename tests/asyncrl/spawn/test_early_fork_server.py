"""The fork server started at ``import asyncrl`` (issue 38 item 4): opt-out, no leak, each start
method."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl._spawn.child import process_alive
from asyncrl._spawn.early import ENV_VARIABLE

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 120

SERVER_PID = """
import asyncrl
from multiprocessing import forkserver
print("SERVER", forkserver._forkserver._forkserver_pid, flush=True)
"""

# A collector in a child process that the trainer started with each start method.
IN_A_CHILD = """
import multiprocessing as mp
import os
import sys
import anyio
import asyncrl
from multiprocessing import forkserver


def collect(queue):
    async def main():
        async with asyncrl.MultiSyncCollector("CartPole-v1", num_workers=1, frames_per_batch=8,
                                              total_frames=8) as c:
            async for batch in c:
                queue.put((list(batch.shape), int(batch["collector", "worker_id"].max())))
    anyio.run(main)


if __name__ == "__main__":
    server = forkserver._forkserver._forkserver_pid
    context = mp.get_context(sys.argv[1])
    queue = context.Queue()
    child = context.Process(target=collect, args=(queue,))
    child.start()
    print("BATCH", *queue.get(timeout=100), flush=True)
    child.join(30)
    print("EXIT", child.exitcode, forkserver._forkserver._forkserver_pid == server, flush=True)
    if server is not None:  # what the trainer's fork server runs now: nothing, no server
        kids = [k for t in os.listdir(f"/proc/{server}/task")
                for k in open(f"/proc/{server}/task/{t}/children").read().split()]
        print("SERVER CHILDREN", len(kids), flush=True)
"""


def _run(code: str, *args: str, env: dict[str, str] | None = None,
         tmp_path: Path | None = None) -> str:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if tmp_path is not None:  # a script file: children run it again as their __main__
        script = tmp_path / "script.py"
        script.write_text(code)
        command = [sys.executable, str(script), *args]
    else:
        command = [sys.executable, "-c", code, *args]
    out = subprocess.run(command, capture_output=True, text=True, timeout=LIMIT,
                         env=environment, cwd=tmp_path or ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _server_pid(stdout: str) -> int | None:
    value = next(line.split()[1] for line in stdout.splitlines() if line.startswith("SERVER"))
    return None if value == "None" else int(value)


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while process_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_import_starts_the_fork_server_and_its_exit_ends_it() -> None:
    pid = _server_pid(_run(SERVER_PID))
    assert pid is not None
    # The interpreter exited right after the import (the server was still importing
    # torch): it was stopped and reaped, not left to finish.
    assert _wait_gone(pid), f"fork server {pid} outlived the process that started it"


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_the_environment_variable_turns_it_off(value: str) -> None:
    assert _server_pid(_run(SERVER_PID, env={ENV_VARIABLE: value})) is None


def test_not_started_when_other_threads_run() -> None:
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(2,)).start()\n"
    assert _server_pid(_run(code + SERVER_PID)) is None


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_a_child_started_with_each_method_collects(start_method: str, tmp_path: Path) -> None:
    out = _run(IN_A_CHILD, start_method, tmp_path=tmp_path)
    assert "BATCH [1, 8] 0" in out, out
    # The child's collector ran on a fork server of its own; the trainer's is untouched.
    assert "EXIT 0 True" in out, out
    assert "SERVER CHILDREN 0" in out, out


def test_not_started_from_a_function_or_an_event_loop() -> None:
    in_a_function = "def f():\n" + "".join(f"    {line}\n" for line in SERVER_PID.splitlines())
    assert _server_pid(_run(in_a_function + "f()\n")) is None
    in_a_loop = "import anyio\nasync def main():\n" + "".join(
        f"    {line}\n" for line in SERVER_PID.splitlines()) + "anyio.run(main)\n"
    assert _server_pid(_run(in_a_loop)) is None


@pytest.mark.parametrize(("orig_argv", "refused"), [
    (["python", "-m", "asyncrl.cli", "worker"], True),  # a worker host: its own fork server
    (["python", "-m", "asyncrl", "bench"], True),
    (["python", "-m", "examples.service"], False),
    (["python", "train.py"], False),
])
def test_python_dash_m_asyncrl_is_its_own_command_line(
        orig_argv: list[str], refused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # runpy imports the package before __main__ and sys.argv say which module runs.
    from asyncrl._spawn import early

    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    monkeypatch.setattr(sys, "argv", ["-m"])
    assert early._is_asyncrl_command() is refused
