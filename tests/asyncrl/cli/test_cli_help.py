"""``asyncrl --help`` and friends: complete, plain text, with defaults and exit codes."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import asyncrl
from asyncrl import cli


def run_help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_every_command_in_plain_text(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = run_help(capsys, "--help")
    for command in ("worker", "keys", "bench"):
        assert f"    {command} " in out
    assert "``" not in out and ":func:" not in out and ":class:" not in out
    assert "exit codes:" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_help(capsys, "--version").strip() == f"asyncrl {asyncrl.__version__}"


def test_worker_help_shows_defaults_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    out = " ".join(run_help(capsys, "worker", "--help").split())  # unwrapped
    for option, default in (("--workers K", "1"), ("--threads T", "1"),
                            ("--peer-timeout SECONDS", "10.0"), ("--backend", "asyncio"),
                            ("--log-level", "INFO"), ("--envs-per-worker N", "1")):
        assert option in out
        assert f"(default: {default})" in out
    for code in ("0 closed by the coordinator", "1 an env or policy error",
                 "2 bad arguments", "3 the coordinator is gone", "4 the coordinator refused"):
        assert code in out
    assert "required (default" not in out  # no "default: None" on required options


def test_subcommand_help_has_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("generate", "add-host", "revoke", "list"):
        assert "0  done (keys written" in run_help(capsys, "keys", command, "--help")
    assert "no benchmarks/NAME.py" in run_help(capsys, "bench", "--help")


def test_bad_log_level_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["worker", "--connect", "tcp://127.0.0.1:1", "--env", "CartPole-v1",
                  "--log-level", "loud"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'LOUD'" in capsys.readouterr().err


def test_log_level_reaches_the_host_and_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class FakeHost:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.update(kwargs)

        def run(self) -> int:
            return 0

    monkeypatch.setattr("asyncrl._worker.host.HostWorkers", FakeHost)
    old = logging.getLogger("asyncrl").level
    try:
        code = cli.main(["worker", "--connect", "tcp://127.0.0.1:1", "--env", "CartPole-v1",
                         "--log-level", "debug"])
        assert logging.getLogger("asyncrl").level == logging.DEBUG
    finally:
        logging.getLogger("asyncrl").setLevel(old)
        logging.getLogger("transports").setLevel(logging.NOTSET)
    assert code == 0
    assert seen["log_config"]["level"] == logging.DEBUG
