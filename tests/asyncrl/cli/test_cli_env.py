"""Every ``asyncrl`` option from an ``ASYNCRL_*`` variable, through the real command line."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncrl import cli
from asyncrl._cli_env import apply_environment, check_environment, option_variables, subparsers

ROOT = Path(__file__).resolve().parents[3]




def test_every_option_of_every_command_names_its_variable(
        capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    commands = subparsers(parser)
    assert {"worker", "env-worker", "keys", "keys generate", "bench"} <= set(commands)
    for name, sub in commands.items():
        variables = option_variables(sub)
        with pytest.raises(SystemExit):
            cli.main([*name.split(), "--help"])
        out = " ".join(capsys.readouterr().out.replace("-\n", "-").split())
        for variable in variables:
            assert f"[env: {variable}]" in out, (name, variable)
    worker = option_variables(commands["worker"])
    assert {"ASYNCRL_CONNECT", "ASYNCRL_ENV", "ASYNCRL_WORKERS", "ASYNCRL_RECONNECT",
            "ASYNCRL_NO_RELAY", "ASYNCRL_PROBE_PORT", "ASYNCRL_KEYS"} <= set(worker)
    assert "ASYNCRL_HELP" not in worker


def test_the_environment_alone_configures_a_worker_host(
        host_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"CONNECT": "tcp://trainer:5555", "ENV": "CartPole-v1",
                        "WORKERS": "3", "PEER_TIMEOUT": "2.5", "RECONNECT": "yes",
                        "NO_RELAY": "0", "PROBE_PORT": "8080", "LOG_LEVEL": "warning",
                        "BACKEND": "trio"}.items():
        monkeypatch.setenv(f"ASYNCRL_{name}", value)
    assert cli.main(["worker"]) == 0
    assert host_kwargs["connect"] == "tcp://trainer:5555"
    assert host_kwargs["spec"].create_env_fn == "CartPole-v1"
    assert host_kwargs["workers"] == 3
    assert host_kwargs["peer_timeout"] == 2.5
    assert host_kwargs["reconnect"] is True
    assert host_kwargs["relay"] is True  # NO_RELAY=0: the relay stays
    assert host_kwargs["probe_port"] == 8080
    assert host_kwargs["probe_host"] == "0.0.0.0"
    assert host_kwargs["backend"] == "trio"


def test_the_command_line_wins(host_kwargs: dict[str, Any],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCRL_CONNECT", "tcp://from-env:1")
    monkeypatch.setenv("ASYNCRL_WORKERS", "not a number")  # never read: the flag is given
    assert cli.main(["worker", "--connect", "tcp://127.0.0.2:2", "--env", "CartPole-v1",
                     "--workers", "2"]) == 0
    assert host_kwargs["connect"] == "tcp://127.0.0.2:2"
    assert host_kwargs["workers"] == 2


@pytest.mark.parametrize(("name", "value", "says"), [
    ("WORKERS", "four", "ASYNCRL_WORKERS='four': not a valid int for --workers"),
    ("RECONNECT", "maybe", "ASYNCRL_RECONNECT='maybe': expected one of 1, true"),
    ("BACKEND", "curio", "ASYNCRL_BACKEND='curio': --backend takes one of asyncio, trio"),
    ("PEER_TIMEOUT", "", "ASYNCRL_PEER_TIMEOUT='': not a valid float"),
])
def test_a_bad_variable_is_a_usage_error_naming_it(
        host_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], name: str, value: str, says: str) -> None:
    monkeypatch.setenv(f"ASYNCRL_{name}", value)
    with pytest.raises(SystemExit) as exited:
        cli.main(["worker", "--connect", "tcp://127.0.0.1:1", "--env", "CartPole-v1"])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
    assert host_kwargs == {}


def test_a_bad_variable_of_another_command_does_not_stop_this_one(
        host_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ASYNCRL_WORKERS", "four")  # `asyncrl worker`'s, not `keys`'
    assert cli.main(["keys", "generate", str(tmp_path / "keys")]) == 0


def test_missing_required_option_still_says_which(
        host_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ASYNCRL_CONNECT", "tcp://trainer:5555")
    with pytest.raises(SystemExit) as exited:
        cli.main(["worker"])
    assert exited.value.code == 2
    assert "--env" in capsys.readouterr().err


def test_flags_repeated_options_and_empty_values() -> None:
    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--quiet", action="store_false")
    parser.add_argument("--tag", action="append", type=str.upper)
    parser.add_argument("--count", type=int, default=1)
    apply_environment(parser, {"ASYNCRL_VERBOSE": "On", "ASYNCRL_QUIET": "",
                               "ASYNCRL_TAG": "a, b,,c"})
    args = parser.parse_args([])
    check_environment(parser, args)
    assert (args.verbose, args.quiet, args.tag, args.count) == (True, True, ["A", "B", "C"], 1)
    assert parser.parse_args(["--tag", "x"]).tag == ["A", "B", "C", "X"]  # argparse appends
    assert "[env: ASYNCRL_COUNT]" in parser.format_help()


def test_python_dash_m_asyncrl_is_the_command() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "asyncrl", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: asyncrl ")
    assert "env-worker" in done.stdout and "ASYNCRL_PEER_TIMEOUT" in done.stdout
