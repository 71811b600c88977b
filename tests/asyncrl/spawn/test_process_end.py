"""What every asyncrl process shares at its end (``asyncrl._spawn``): exit codes, stop
signals, the error that ended its main."""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from asyncrl import cli
from asyncrl._spawn import exit_codes
from asyncrl._spawn.stop_signals import STOP_SIGNALS, ignore_stop_signals, wait_stop_signal

PROCESS_CODES = {name: code for name, code in vars(exit_codes).items()
                 if name.startswith("EXIT_") and code >= 0}


def test_each_process_exit_code_means_one_thing() -> None:
    assert len(set(PROCESS_CODES.values())) == len(PROCESS_CODES)
    assert exit_codes.EXIT_REJOIN < 0  # not an exit code: never reaches the OS


@pytest.mark.parametrize("name", sorted(PROCESS_CODES))
def test_asyncrl_worker_help_explains_each_code(name: str) -> None:
    lines = cli.WORKER_EXIT_CODES.splitlines()
    assert any(line.startswith(f"  {PROCESS_CODES[name]}  ") for line in lines)


@pytest.mark.anyio
async def test_the_first_stop_signal_is_returned_and_the_next_can_be_ignored() -> None:
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                received: list[signal.Signals] = []

                async def wait() -> None:
                    received.append(await wait_stop_signal())

                tg.start_soon(wait)
                await anyio.wait_all_tasks_blocked()
                os.kill(os.getpid(), signal.SIGTERM)
        assert received == [signal.SIGTERM]
        ignore_stop_signals()
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: this test goes on
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def test_the_error_that_ended_a_main_is_found_inside_its_task_groups() -> None:
    from asyncrl._spawn.child import ending_error

    error = KeyError("obs")
    assert ending_error(BaseExceptionGroup("tg", [ExceptionGroup("inner", [error])])) is error
    assert ending_error(error) is error
