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
    # The thread runs until the import is over (however long it takes), then ends.
    code = ("import threading\nrunning = threading.Event()\n"
            "threading.Thread(target=running.wait, args=(LIMIT,)).start()\n")
    assert _server_pid(_run(code.replace("LIMIT", str(LIMIT)) + SERVER_PID
                            + "running.set()\n")) is None


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


# A script whose module level notes every process that runs it; its env factory notes
# what the worker process holds.
WHO_RUNS = """
import os
with open(os.environ["NOTES"], "a") as f:
    f.write(f"run {os.getpid()} {__name__}\\n")
import anyio
import asyncrl


def make_env():
    import gc, importlib, sys, threading
    import gymnasium as gym
    # Another thread imports from asyncrl: it must not wait for the import lock the
    # fork server's frozen 'import asyncrl' holds.
    thread = threading.Thread(target=importlib.import_module, args=("asyncrl.testing",))
    thread.start()
    thread.join(60)
    with open(os.environ["NOTES"], "a") as f:
        f.write(f"worker {os.getpid()} torchrl={'torchrl' in sys.modules} "
                f"ray={'ray' in sys.modules} frozen={gc.get_freeze_count() > 0} "
                f"thread_import_done={not thread.is_alive()}\\n")
    return gym.make("CartPole-v1")


async def main():
    async with asyncrl.MultiSyncCollector(make_env, num_workers=1, frames_per_batch=8,
                                          total_frames=8) as c:
        async for batch in c:
            print("WORKER", c.worker_pids[0], list(batch.shape), flush=True)


if __name__ == "__main__":
    from multiprocessing import forkserver
    print("SERVER", forkserver._forkserver._forkserver_pid, flush=True)
    anyio.run(main)
"""


def test_the_script_runs_once_in_the_fork_server_not_in_each_worker(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    out = _run(WHO_RUNS, env={"NOTES": str(notes)}, tmp_path=tmp_path)
    server = _server_pid(out)
    worker = next(line.split()[1] for line in out.splitlines() if line.startswith("WORKER"))
    assert "[1, 8]" in out, out
    runs = [line.split()[1:] for line in notes.read_text().splitlines() if line.startswith("run")]
    # The trainer ran it as __main__, the fork server as its workers' __mp_main__; the
    # worker, forked from that server, did not run it again.
    assert [name for _, name in runs] == ["__main__", "__mp_main__"], runs
    assert runs[1][0] == str(server) and worker not in (pid for pid, _ in runs), (runs, worker)
    assert f"worker {worker} torchrl=False ray=False frozen=True thread_import_done=True" \
        in notes.read_text(), notes.read_text()


# No `if __name__ == "__main__":` guard: the fork server (and each worker) must not run it
# again. It logs each run of its top level. Its last collection forks workers from the fork
# server, which serves only once its preload (where it ran __main__ before) is over.
UNGUARDED = """
import os, sys
import anyio, gymnasium
import asyncrl
with open("runs.log", "a") as log:
    log.write(f"{os.getpid()}\\n")


def make_env():
    return gymnasium.make("CartPole-v1")


async def collect(env):
    async with asyncrl.MultiSyncCollector(env, num_workers=2, frames_per_batch=8,
                                          total_frames=16) as c:
        return [list(batch.shape) async for batch in c]

if sys.argv[1] == "factory":
    try:
        anyio.run(collect, make_env)
    except TypeError as exc:
        print("REFUSED", exc)
print("SHAPES", anyio.run(collect, "CartPole-v1"))
"""


def test_a_script_without_a_main_guard_runs_once_and_collects(tmp_path: Path) -> None:
    out = _run(UNGUARDED, "id", tmp_path=tmp_path)
    assert "SHAPES [[2, 4], [2, 4]]" in out, out
    assert len((tmp_path / "runs.log").read_text().split()) == 1


def test_a_script_without_a_main_guard_cannot_send_its_own_functions(tmp_path: Path) -> None:
    out = _run(UNGUARDED, "factory", tmp_path=tmp_path)
    refused = next(line for line in out.splitlines() if line.startswith("REFUSED"))
    assert "make_env" in refused, refused
    assert 'a script without an `if __name__ == "__main__":` guard' in refused, refused
    assert len((tmp_path / "runs.log").read_text().split()) == 1
