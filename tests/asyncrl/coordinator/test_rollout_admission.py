"""Admission and the run's rollout options: the welcome carries them, and a host that
cannot apply them, or whose own command line says otherwise, is refused by name."""

from __future__ import annotations

import dataclasses
from typing import Any

from asyncrl._coordinator.state import CoordinatorState, Send
from asyncrl._protocol import Refuse, Welcome
from asyncrl._rollout.options import RolloutOptions
from tests.asyncrl.coordinator.test_coordinator_state import hello, state

RUN = RolloutOptions(max_frames_per_traj=5, set_truncated=True, info_keys=["t"])


def new_host(**options: Any) -> Any:
    """A hello of this release: the host's own options (its command line's) named."""
    return dataclasses.replace(hello(), rollout=RolloutOptions(**options).to_wire())


def answer(s: CoordinatorState, host: Any) -> Any:
    return s.hello(b"h", host)[0]


def test_the_welcome_carries_the_runs_rollout_options() -> None:
    sent = answer(state(rollout=RUN), new_host())
    assert isinstance(sent, Send) and isinstance(sent.message, Welcome)
    assert sent.message.rollout == RUN.to_wire()
    assert RolloutOptions.from_wire(sent.message.rollout) == RUN


def test_a_host_of_an_earlier_release_is_refused_naming_the_options_it_would_drop() -> None:
    # Before, it was welcomed and ran with its own defaults: 67-step trajectories for a
    # trainer that asked for 5.
    assert answer(state(rollout=RUN), hello()) == Send(b"h", Refuse(
        "rollout options: this host cannot apply the trainer's max_frames_per_traj=5, "
        "set_truncated=True, info_keys=[[['t'], None]] (its asyncrl release predates these "
        "options travelling in the welcome: it would run with its own values); upgrade "
        "asyncrl on the host"))


def test_a_host_of_an_earlier_release_still_joins_a_run_with_the_default_options() -> None:
    sent = answer(state(rollout=RolloutOptions()), hello())
    assert isinstance(sent.message, Welcome) and sent.message.rollout == {}


def test_a_host_flag_that_differs_from_the_runs_option_is_refused_naming_both() -> None:
    assert answer(state(rollout=RUN), new_host(info_keys=["x"])) == Send(b"h", Refuse(
        "rollout option info_keys: this host was started with [[['x'], None]] and the "
        "trainer's is [[['t'], None]]; start the host without it (the trainer's rollout "
        "options reach every host in its welcome) or with the same value"))
    # A flag the run does not set at all is a conflict too: the trainer asked for none.
    refused = answer(state(), new_host(info_keys=["x"]))
    assert isinstance(refused.message, Refuse)
    assert "this host was started with [[['x'], None]] and the trainer's is None" in \
        refused.message.reason


def test_a_host_flag_equal_to_the_runs_option_is_welcome() -> None:
    sent = answer(state(rollout=RUN), new_host(info_keys=["t"]))
    assert isinstance(sent.message, Welcome) and sent.message.rollout == RUN.to_wire()


def test_a_host_gets_only_the_options_its_hello_names() -> None:
    # A later release's option stays home with a host that does not know it (it is the
    # default there, or the host was refused above).
    host = new_host()
    host.rollout = {k: v for k, v in host.rollout.items() if k != "policy_method"}
    sent = answer(state(rollout=RUN), host)
    assert isinstance(sent.message, Welcome)
    assert set(sent.message.rollout) == set(RUN.to_wire()) - {"policy_method"}
