"""The rollout options' wire form: what a welcome carries, as data, checked as hostile input.

``RolloutOptions.to_wire()`` is the trainer's half, ``RolloutOptions.from_wire()`` the
worker's: every option but the devices travels, survives msgpack, and a map that is
not a map of known options of their types and bounds is a ``ProtocolError`` naming
the option (tests/multihost/test_rollout_options.py runs them across a real host).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
import torch

from asyncrl._protocol import Hello, Welcome
from asyncrl._rollout.options import HOST_FIELDS, RolloutOptions, wire_fields
from transports import ProtocolError, decode, encode

#: A value away from the default for every travelling option (reset_when_done has none).
NON_DEFAULT: dict[str, Any] = {
    "max_frames_per_traj": 7, "reset_at_each_iter": True, "reset_when_done": True,
    "set_truncated": True, "exploration_type": "deterministic",
    "policy_in_keys": ["observation", ("nested", "key")],
    "policy_out_keys": ("action", "value"), "policy_method": "get_action_and_value",
    "info_keys": {"episode": None, ("stats", "x"): ((2, 3), "float32"), "ok": "bool"},
}


def over_the_wire(body: dict[str, Any]) -> Any:
    """``body`` as a peer receives it (msgpack there and back)."""
    return decode(encode(body))


def test_every_option_travels_but_the_devices() -> None:
    names = {f.name for f in fields(RolloutOptions)}
    assert set(wire_fields()) == names - HOST_FIELDS
    assert HOST_FIELDS == {"policy_device", "env_device", "storing_device"}
    assert set(NON_DEFAULT) == set(wire_fields())  # a new option: give it a value here


def test_a_welcome_carries_every_option_through_msgpack_unchanged() -> None:
    options = RolloutOptions(**NON_DEFAULT)
    welcome = Welcome(index=3, share_frames=8, rollout=options.to_wire())
    received = Welcome.from_body(over_the_wire(welcome.to_body()))
    assert RolloutOptions.from_wire(received.rollout) == options
    assert received.rollout == options.to_wire()


def test_the_devices_stay_the_hosts_and_an_option_left_out_keeps_the_hosts_value() -> None:
    trainer = RolloutOptions(max_frames_per_traj=3, storing_device="cpu", policy_device="cpu")
    wire = trainer.to_wire()
    assert not HOST_FIELDS & set(wire)
    host = RolloutOptions(policy_device="cpu", info_keys=["steps"])
    applied = RolloutOptions.from_wire({"max_frames_per_traj": 3}, base=host)
    assert applied == RolloutOptions(max_frames_per_traj=3, policy_device="cpu",
                                     info_keys=["steps"])
    assert RolloutOptions.from_wire(wire, base=host).policy_device == torch.device("cpu")
    assert RolloutOptions.from_wire(wire, base=host).storing_device is None  # the trainer's
    assert RolloutOptions.from_wire({}, base=host) == host  # a coordinator before them


@pytest.mark.parametrize(("wire", "message"), [
    ([1, 2], "welcome rollout must be a map of at most 64 rollout options, got [1, 2]"),
    ({f"o{i}": 0 for i in range(65)}, "must be a map of at most 64"),
    ({"run_this": "os.system('rm -rf /')"},
     "welcome rollout names options this host does not know: 'run_this'"),
    ({"max_frames_per_traj": "5"},
     "welcome rollout option max_frames_per_traj must be null (no limit) or an int in "
     "1..2**62, got '5'"),
    ({"max_frames_per_traj": 0}, "max_frames_per_traj must be null (no limit)"),
    ({"max_frames_per_traj": True}, "max_frames_per_traj must be null (no limit)"),
    ({"max_frames_per_traj": 1 << 62}, "max_frames_per_traj must be null (no limit)"),
    ({"set_truncated": 1}, "welcome rollout option set_truncated must be true or false, got 1"),
    ({"reset_at_each_iter": None}, "reset_at_each_iter must be true or false"),
    ({"reset_when_done": False}, "welcome rollout: reset_when_done=False is not supported"),
    ({"exploration_type": "explore-hard"}, "exploration_type must be an ExplorationType or"),
    ({"exploration_type": 3}, "exploration_type must be a string of 1 to 256"),
    ({"policy_in_keys": []}, "policy_in_keys must be null or a list of 1 to 64 keys"),
    ({"policy_in_keys": "observation"}, "policy_in_keys must be null or a list of 1 to 64"),
    ({"policy_in_keys": ["k"] * 65}, "policy_in_keys must be null or a list of 1 to 64"),
    ({"policy_in_keys": [["a"] * 9]}, "policy_in_keys must be keys: a string or a list of "
                                      "1 to 8 strings"),
    ({"policy_in_keys": ["x" * 257]}, "policy_in_keys must be a string of 1 to 256"),
    ({"policy_in_keys": [1]}, "policy_in_keys must be keys"),
    ({"policy_in_keys": ["a", "a"]}, "policy_in_keys names a key twice"),
    ({"policy_out_keys": ["value"]}, "policy_out_keys=['value'] has no 'action'"),
    ({"policy_method": "os.system('x')"}, "policy_method must be the name of a method"),
    ({"policy_method": ["act"]}, "policy_method must be a string"),
    ({"info_keys": [["steps"]]}, "info_keys must be [key path, spec or null] pairs"),
    ({"info_keys": [[["big"], [[1 << 20, 1 << 20], "float32"]]]},
     "info_keys must be specs as [shape (at most 8 sizes), dtype name] of at most 1048576"),
    ({"info_keys": [[["neg"], [[-1], "float32"]]]}, "info_keys must be specs as"),
    ({"info_keys": [[["obj"], [[2], "object"]]]}, "object is not a number or bool dtype"),
    ({"info_keys": [[["reward"], None]]}, "'reward' clashes with the batch's own"),
], ids=lambda value: str(value)[:40] if isinstance(value, dict | list) else None)
def test_a_hostile_rollout_map_is_refused_naming_the_option(wire: Any, message: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        RolloutOptions.from_wire(over_the_wire({"m": wire})["m"])
    assert message in str(caught.value)


@pytest.mark.parametrize("message", [Hello, Welcome])
@pytest.mark.parametrize(("rollout", "text"), [
    ("max_frames_per_traj=5", "field 'rollout' must be map, got str"),
    ({str(i): 0 for i in range(65)}, "field 'rollout' must be map of length <= 64, got dict "
     "of length 65"),
    ({"x" * 65: 0}, "field 'rollout' must have str of length <= 64 keys"),
    ({"": 0}, "field 'rollout' must have str of length >= 1 keys"),
])
def test_a_hello_or_welcome_whose_rollout_is_no_small_map_is_refused(
        message: Any, rollout: Any, text: str) -> None:
    """Both read the rollout map from one declaration (admission.RolloutMap), in its words."""
    body = (Hello(protocol=2, name="w", host="h", pid=1, specs={}) if message is Hello
            else Welcome(index=0, share_frames=8)).to_body()
    with pytest.raises(ProtocolError) as caught:
        message.from_body({**body, "rollout": rollout})
    assert f"{message.KIND} message {text}" in str(caught.value)


def test_a_hello_or_welcome_of_an_earlier_release_has_no_rollout_options() -> None:
    hello = Hello(protocol=2, name="w", host="h", pid=1, specs={}).to_body()
    welcome = Welcome(index=0, share_frames=8).to_body()
    del hello["rollout"], welcome["rollout"]
    assert Hello.from_body(hello).rollout == {} and Welcome.from_body(welcome).rollout == {}
