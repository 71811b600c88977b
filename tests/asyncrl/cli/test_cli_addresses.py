"""``asyncrl worker``: a bad address or worker count is exit 2 and one line, at start (#35.4).

Before, ``--connect tcp://127.0.0.1`` and ``--connect http://...`` ran 16-20 s and
ended in a worker process's 46-line traceback (exit 1), an unresolvable host
name said "no coordinator answered ... firewall", and ``ASYNCRL_WORKERS=100000000``
built 10^8 identities until the host was killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncrl import cli

ROOT = Path(__file__).resolve().parents[3]
ENV = ("--env", "CartPole-v1")




def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one error line of a usage error (exit 2) of ``asyncrl argv``."""
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    assert exited.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines()
             if "error:" in line or "Traceback" in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("command", ["worker", "env-worker"])
@pytest.mark.parametrize(("address", "says"), [
    ("tcp://127.0.0.1", "'tcp://127.0.0.1' has no port"),
    ("http://trainer:5555", "'http://trainer:5555' has the scheme 'http'"),
    ("tcp://trainer:99999", "the port 99999, out of range"),
    ("tcp://*:5555", "connects to '*'"),
])
def test_a_bad_connect_address_is_a_usage_error_at_parse_time(
        host_kwargs: dict[str, Any], capsys: pytest.CaptureFixture[str], command: str,
        address: str, says: str) -> None:
    line = usage_error(capsys, command, "--connect", address, *ENV)
    assert f"error: argument --connect: {address!r} " in line
    assert says in line and "expected tcp://HOST:PORT" in line
    assert host_kwargs == {}


def test_a_bad_connect_variable_is_a_usage_error_naming_it(
        host_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASYNCRL_CONNECT", "tcp://127.0.0.1")
    line = usage_error(capsys, "worker", *ENV)
    assert "ASYNCRL_CONNECT='tcp://127.0.0.1': not a valid address for --connect" in line
    assert "has no port" in line and host_kwargs == {}


def test_good_addresses_reach_the_host_unchanged(host_kwargs: dict[str, Any]) -> None:
    for address in ("tcp://127.0.0.1:5555", "tcp://localhost:1", "tcp://[::1]:5555",
                    "ipc:///tmp/asyncrl-x/coordinator"):
        assert cli.main(["worker", "--connect", address, *ENV]) == 0
        assert host_kwargs["connect"] == address


def test_a_host_name_that_does_not_resolve_is_exit_2_naming_it(
        host_kwargs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["worker", "--connect", "tcp://trainer.invalid:5555", *ENV]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("asyncrl worker: --connect: the host name 'trainer.invalid'")
    assert "does not resolve" in err and "firewall" not in err and "\n" not in err
    assert host_kwargs == {}


def test_with_reconnect_an_unresolved_name_is_a_warning_and_the_workers_wait(
        host_kwargs: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    # The name may appear later (a pod's DNS record once it is ready): --reconnect waits.
    assert cli.main(["worker", "--connect", "tcp://trainer.invalid:5555", *ENV,
                     "--reconnect"]) == 0
    assert host_kwargs["connect"] == "tcp://trainer.invalid:5555"
    assert "does not resolve" in caplog.text


@pytest.mark.parametrize("given", [["--workers", "100000000"], ["--workers", "1025"]])
def test_more_workers_than_the_bound_is_exit_2_naming_it(
        host_kwargs: dict[str, Any], capsys: pytest.CaptureFixture[str], given: list[str]) -> None:
    assert cli.main(["worker", "--connect", "tcp://127.0.0.1:5555", *ENV, *given]) == 2
    err = capsys.readouterr().err
    assert f"--workers {given[1]} is more than --max-workers 1024" in err
    assert host_kwargs == {}


def test_the_worker_bound_is_configurable_by_flag_and_variable(
        host_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.main(["worker", "--connect", "tcp://127.0.0.1:5555", *ENV, "--workers", "1500",
                     "--max-workers", "2048"]) == 0
    assert host_kwargs["workers"] == 1500
    monkeypatch.setenv("ASYNCRL_MAX_WORKERS", "4")
    monkeypatch.setenv("ASYNCRL_WORKERS", "5")
    assert cli.main(["worker", "--connect", "tcp://127.0.0.1:5555", *ENV]) == 2


def test_the_issue_cases_end_at_once_as_a_subprocess() -> None:
    # Through the real command: exit 2 with one line, no worker process, no traceback.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ASYNCRL_WORKERS": "100000000"}
    for argv, says in ((["--connect", "tcp://127.0.0.1"], "has no port"),
                       (["--connect", "http://127.0.0.1:5555"], "the scheme 'http'"),
                       (["--connect", "tcp://127.0.0.1:5555"], "more than --max-workers")):
        done = subprocess.run([sys.executable, "-m", "asyncrl", "worker", *argv, *ENV],
                              capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
        assert done.returncode == 2, done.stderr
        assert says in done.stderr and "Traceback" not in done.stderr
