"""A remote host that lacks the run's gymnasium id is told, as data, where it comes from.

Its hello names the id (``env_missing``, no specs); the coordinator refuses it with
the trainer's :class:`~asyncrl._rollout.env_ids.EnvIdSource` (module to import,
registration as plain data), offered only to a peer that may otherwise join and
only for this run's id. What a coordinator sends there is hostile input to the
host: checked before anything is imported or registered.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from asyncrl._coordinator.state import CoordinatorState, Send
from asyncrl._protocol import PROTOCOL, Hello, Refuse
from asyncrl._protocol.env_source import read_env_source
from asyncrl._rollout.env_ids import EnvIdSource
from tests.asyncrl.coordinator.rules import rules
from transports import ProtocolError, decode, encode

SOURCE = EnvIdSource("Counting-v0", "tests.asyncrl.collectors.runtime_envs", "", {
    "entry_point": "tests.asyncrl.collectors.runtime_envs:CountingEnv",
    "reward_threshold": None, "nondeterministic": False, "max_episode_steps": 3,
    "order_enforce": True, "disable_env_checker": False, "kwargs": {"start": 5.0},
    "vector_entry_point": None})


def state(source: EnvIdSource | None = SOURCE, **options: Any) -> CoordinatorState:
    return CoordinatorState(*rules(**{"accept_remote": True, "env_source": source, **options}))


def missing(env_id: str = "Counting-v0", protocol: int = PROTOCOL) -> Hello:
    return Hello(protocol=protocol, name="w", host="h", pid=os.getpid(), specs={},
                 env_missing=env_id)


def refusal(s: CoordinatorState, hello: Hello) -> Refuse:
    [send] = s.hello(b"peer", hello)
    assert isinstance(send, Send) and isinstance(send.message, Refuse)
    return Refuse.from_body(decode(encode(send.message.to_body())))  # as the host reads it


def test_a_host_that_lacks_the_runs_id_is_told_where_it_comes_from() -> None:
    refuse = refusal(state(), missing())
    assert refuse.env_source == SOURCE.to_body()
    assert EnvIdSource(**refuse.env_source) == SOURCE
    assert refuse.reason == ("env: this host cannot make the gymnasium id 'Counting-v0': "
                             "import 'tests.asyncrl.collectors.runtime_envs' first")
    assert not refuse.full


@pytest.mark.parametrize(("s", "hello", "reason"), [
    (state(), missing("Other-v0"), "it is not this collector's id"),
    (state(None), missing(), "the trainer does not know where it is registered"),
    (state(EnvIdSource("Counting-v0", "__main__", "", {**SOURCE.spec,
                                                       "entry_point": "__main__:CountingEnv"})),
     missing(), "define the env class in an importable module"),
    (state(accept_remote=False), missing(), "remote workers are not accepted"),
    (state(), missing(protocol=PROTOCOL + 1), "protocol: coordinator speaks"),
])
def test_nothing_is_offered_for_another_id_a_script_or_a_peer_that_may_not_join(
        s: CoordinatorState, hello: Hello, reason: str) -> None:
    refuse = refusal(s, hello)
    assert refuse.env_source is None
    assert reason in refuse.reason


def test_a_refusal_without_a_source_reads_as_before() -> None:
    assert Refuse("no").to_body() == {"reason": "no", "full": False}
    assert Refuse.from_body({"reason": "no"}).env_source is None


BAD: list[tuple[str, Any, str]] = [
    ("module", "__main__", "not a script's __main__"),
    ("module", "os; rm", "a dotted module name"),
    ("module", 3, "^env_source field 'module' must be str, got int$"),
    ("module", "m" * 201, "field 'module' must be str of length <= 200"),
    ("env_id", "", "field 'env_id' must be str of length >= 1, got str of length 0"),
    ("env_id", "x\x1b[2J", "a printable text"),
    ("package", "ale py", "a distribution name"),
    ("spec", [], "field 'spec' must be map, got list"),
    ("spec", {"entry_point": "m:X"}, "spec field 'reward_threshold' is missing"),
    ("spec", {**SOURCE.spec, "entry_point": "elsewhere:CountingEnv"}, "is not in its module"),
    ("spec", {**SOURCE.spec, "entry_point": "not a path"}, "must be an import path"),
    ("spec", {**SOURCE.spec, "max_episode_steps": True},
     r"spec field 'max_episode_steps' must be int \| None, got bool"),
    ("spec", {**SOURCE.spec, "kwargs": {"k": b"bytes"}}, "kwargs must be plain data"),
    ("spec", {**SOURCE.spec, "kwargs": {1: 2}}, "spec field 'kwargs' must have str keys"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD)
def test_a_hostile_env_source_is_refused_before_anything_is_imported(
        name: str, value: Any, message: str) -> None:
    body = {**SOURCE.to_body(), name: value}
    with pytest.raises(ProtocolError, match=message.replace("(", r"\(")):
        read_env_source(body)
    with pytest.raises(ProtocolError):
        Refuse.from_body({"reason": "r", "env_source": body})


def test_a_spec_field_beyond_gymnasiums_is_not_kept() -> None:
    # Declared fields only (a newer trainer may send more): nothing else reaches register().
    body = {**SOURCE.to_body(), "spec": {**SOURCE.spec, "additional_wrappers": "os:system"}}
    assert read_env_source(body) == SOURCE.to_body()


def test_a_hellos_missing_id_is_bounded_and_printable() -> None:
    body = missing().to_body()
    assert Hello.from_body(body).env_missing == "Counting-v0"
    assert Hello.from_body({**body, "env_missing": "a\x1b[2J"}).env_missing == "a\\x1b[2J"
    assert len(Hello.from_body({**body, "env_missing": "x" * 10_000}).env_missing) <= 210
