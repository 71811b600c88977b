"""``asyncrl worker --info-key``: the env info entries a remote host's batches carry
(what the trainer's ``info_keys`` asks for; tests/asyncrl/rollout/test_info_keys_remote.py
runs a host with them)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.cli import main as cli_main

ENV = "tests.asyncrl.rollout.info_envs:make_step_info_env"


def test_info_key_flags_become_the_hosts_info_keys(host_kwargs: dict[str, Any]) -> None:
    assert cli_main(["worker", "--connect", "tcp://127.0.0.1:5555", "--env", ENV,
                     "--info-key", "steps", "--info-key", "stats.x"]) == 0
    assert host_kwargs["spec"].rollout.info_keys == ((("steps",), None), (("stats", "x"), None))


def test_info_keys_come_from_the_environment_too(host_kwargs: dict[str, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCRL_INFO_KEY", "steps,stats")
    assert cli_main(["worker", "--connect", "tcp://127.0.0.1:5555", "--env", ENV]) == 0
    assert host_kwargs["spec"].rollout.info_keys == ((("steps",), None), (("stats",), None))


def test_a_host_without_info_keys_reads_none(host_kwargs: dict[str, Any]) -> None:
    assert cli_main(["worker", "--connect", "tcp://127.0.0.1:5555", "--env", ENV]) == 0
    assert host_kwargs["spec"].rollout.info_keys is None
