"""The compact wire form (``asyncrl._protocol.compact_frames``): a batch rebuilt on the
trainer is bit-identical to the one the worker compacted; hostile patches are refused."""

from __future__ import annotations

import doctest
import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from tensordict import TensorDict, TensorDictBase

import asyncrl._protocol.compact_frames
from asyncrl._protocol import Batch, drop_twins
from asyncrl._protocol.compact_frames import compact, compactable_keys, rebuild
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.loop import Rollout
from asyncrl._rollout.options import RolloutOptions
from asyncrl.testing import IdentityEnv
from transports import ProtocolError, decode, encode


class DictEnv(gym.Env):
    """Nested, several observation keys: uint8 pixels and a float state, episodes of 3."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict({
            "pixels": gym.spaces.Box(0, 255, (4, 8, 8), np.uint8),
            "state": gym.spaces.Dict({"pos": gym.spaces.Box(-1e6, 1e6, (70,), np.float32)})})
        self.action_space = gym.spaces.Discrete(2)
        self.t = self.steps = 0

    def _obs(self) -> dict[str, Any]:
        return {"pixels": np.full((4, 8, 8), self.steps % 251, np.uint8),
                "state": {"pos": np.full(70, self.t, np.float32)}}

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        self.steps += 1
        return self._obs(), 1.0, self.t >= 3, False, {"steps": self.steps}


def wire_trip(frames: TensorDictBase, **kwargs: Any) -> tuple[TensorDictBase, int]:
    """frames -> compact -> the codec's frames -> Batch.from_body: (the rebuilt, bytes sent)."""
    wire, patch = compact(frames, **kwargs)
    parts = encode(Batch(7, wire, patch).to_body())
    return Batch.from_body(decode(parts)).frames, sum(len(memoryview(p)) for p in parts)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dtype != torch.bool else t


def assert_identical(got: TensorDictBase, want: TensorDictBase) -> None:
    keys = set(want.keys(include_nested=True, leaves_only=True))
    assert set(got.keys(include_nested=True, leaves_only=True)) == keys
    assert got.batch_size == want.batch_size
    for key in keys:
        a, b = got.get(key), want.get(key)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), key
        assert torch.equal(bits(a), bits(b)), key


def batches(rollout: Rollout, count: int, **collect: Any) -> list[TensorDictBase]:
    return [rollout.collect(**collect).clone() for _ in range(count)]


def test_identity_envs_with_episode_ends_inside_the_batch_rebuild_exactly() -> None:
    with Rollout(make_env_pool(IdentityEnv, create_env_kwargs={"length": 3}, num_envs=2),
                 None, frames_per_batch=16) as rollout:
        for want in batches(rollout, 3):
            assert want["next", "done"].any()
            got, _ = wire_trip(want, min_bytes=0)
            assert_identical(got, want)


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_gymnasium_autoreset_modes_rebuild_exactly(mode: AutoresetMode) -> None:
    venv = SyncVectorEnv([lambda: IdentityEnv(length=3)] * 3, autoreset_mode=mode)
    with Rollout(make_env_pool(venv), None, frames_per_batch=24) as rollout:
        for want in batches(rollout, 3):
            got, _ = wire_trip(want, min_bytes=0)
            assert_identical(got, want)
            # IdentityEnv counts steps across resets: next is always obs + 1 step
            steps = want["observation"][..., 2]
            assert torch.equal(got["next", "observation"][..., 2], steps + 1)


def test_short_and_empty_batches_rebuild_exactly() -> None:
    with Rollout(make_env_pool(IdentityEnv, create_env_kwargs={"length": 2}, num_envs=2),
                 None, frames_per_batch=20) as rollout:
        for want in batches(rollout, 2, max_steps=3):
            assert want.batch_size == torch.Size([2, 3])
            assert_identical(wire_trip(want, min_bytes=0)[0], want)
        empty = rollout.collect(max_steps=0).clone()
        wire, patch = compact(empty, min_bytes=0)
        assert patch is None
        assert_identical(Batch.from_body(decode(encode(Batch(1, wire).to_body()))).frames, empty)


def test_max_frames_per_traj_and_set_truncated_rebuild_exactly() -> None:
    options = RolloutOptions(max_frames_per_traj=2, set_truncated=True)
    with Rollout(make_env_pool(IdentityEnv, create_env_kwargs={"length": 50}, num_envs=2),
                 None, frames_per_batch=14, options=options) as rollout:
        for want in batches(rollout, 2):
            assert want["next", "truncated"].sum() >= 6
            assert_identical(wire_trip(want, min_bytes=0)[0], want)


def test_nested_keys_infos_and_extras_rebuild_exactly_and_cross_once() -> None:
    def policy(td: TensorDictBase) -> TensorDictBase:
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        td["logits"] = torch.ones(*td.batch_size, 2)  # an extra: not an observation
        return td

    options = RolloutOptions(info_keys=["steps"])
    with Rollout(make_env_pool(DictEnv, num_envs=2), policy, frames_per_batch=32,
                 options=options) as rollout:
        want = rollout.collect().clone()
        keys = compactable_keys(want, min_bytes=0)
        assert sorted(keys) == [("pixels",), ("state", "pos")]
        got, sent = wire_trip(want)
        assert_identical(got, want)
    # 16 steps per env, episodes of 3: 5 ends + the last step per env ship, 20 do not
    _, patch = compact(want)
    assert patch is not None and patch["at"].numel() == 12
    _, full = wire_trip(want, min_bytes=1 << 30)
    per_obs = 4 * 8 * 8 + 70 * 4
    assert 20 * per_obs - 200 < full - sent <= 20 * per_obs  # the patch's header: < 200 B


def test_a_policy_that_edits_an_observation_in_place_is_shipped_not_rebuilt() -> None:
    def policy(td: TensorDictBase) -> TensorDictBase:
        td["pixels"].add_(1)  # in place: the frame's obs is not the previous next obs
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        return td

    with Rollout(make_env_pool(DictEnv, num_envs=2), policy, frames_per_batch=8) as rollout:
        want = rollout.collect().clone()
        _, patch = compact(want)
        assert patch is not None and patch["at"].numel() == 8  # every row differs
        assert_identical(wire_trip(want)[0], want)


def test_bits_not_values_decide_nan_and_negative_zero_and_states() -> None:
    obs = torch.zeros(2, 4, 80)
    nxt = torch.zeros(2, 4, 80)
    obs[:, :, 0], nxt[:, :, 0] = float("nan"), float("nan")  # NaN == NaN as bits
    nxt[0, 1, 1] = -0.0  # -0.0 == 0.0 as values, not as bits
    state = torch.randn(2, 4, 64, dtype=torch.float64)  # a recurrent state carried as obs
    frames = TensorDict({"observation": obs, ("next", "observation"): nxt,
                         "hidden": state, ("next", "hidden"): state.roll(-1, 1),
                         "is_init": torch.zeros(2, 4, 1, dtype=torch.bool),
                         ("next", "is_init"): torch.zeros(2, 4, 1, dtype=torch.bool),
                         "done": torch.zeros(2, 4, 1, dtype=torch.bool),
                         ("next", "done"): torch.ones(2, 4, 1, dtype=torch.bool)}, [2, 4])
    wire, patch = compact(frames, min_bytes=0)
    assert patch is not None
    assert patch["at"].tolist() == [1, 3, 7]  # -0.0 at (0, 1); each env's last step
    assert ("next", "done") in wire.keys(include_nested=True)  # flags are never compacted
    assert_identical(wire_trip(frames, min_bytes=0)[0], frames)


def test_compact_obs_drops_observation_and_state_twins_only() -> None:
    frames = TensorDict({"observation": torch.zeros(3, 2), ("next", "observation"):
                         torch.zeros(3, 2), ("a", "b"): torch.zeros(3), ("next", "a", "b"):
                         torch.zeros(3), ("next", "reward"): torch.zeros(3, 1),
                         "done": torch.zeros(3, 1, dtype=torch.bool),
                         ("next", "done"): torch.zeros(3, 1, dtype=torch.bool),
                         ("next", "info"): torch.zeros(3)}, [3])
    kept = set(drop_twins(frames).keys(include_nested=True, leaves_only=True))
    assert kept == {"observation", ("a", "b"), ("next", "reward"), "done", ("next", "done"),
                    ("next", "info")}


def compact_pair() -> tuple[TensorDictBase, dict[str, Any]]:
    obs = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    frames = TensorDict({"observation": obs, ("next", "observation"): obs + 100,
                         ("next", "reward"): torch.zeros(2, 3, 1)}, [2, 3])
    wire, patch = compact(frames, min_bytes=0)
    assert patch is not None
    return wire, patch


def _replace(**fields: Any) -> Any:
    def make(patch: dict[str, Any]) -> Any:
        return {**patch, **{k: (v(patch) if callable(v) else v) for k, v in fields.items()}}
    return make


HOSTILE = {
    "not a map": (lambda p: [1, 2], "batch message field 'next' must be map | None, got list"),
    "rows missing": (lambda p: {"at": p["at"]}, "batch message field 'next.rows' is missing"),
    "at as floats": (_replace(at=lambda p: p["at"].float()), "1-d int64 tensor"),
    "at not a tensor": (_replace(at=[0, 1]), "field 'next.at' must be Tensor, got list"),
    "rows too few": (_replace(rows=lambda p: p["rows"][:2]), "batch size [6]"),
    "out of range": (_replace(at=lambda p: p["at"] + 1), "increasing positions in [0, 6)"),
    "negative": (_replace(at=lambda p: p["at"] - 1), "increasing positions in [0, 6)"),
    "repeated": (_replace(at=torch.tensor([2, 2, 2, 2, 5, 5])), "increasing positions"),
    "last step missing": (lambda p: {"at": p["at"][:5], "rows": p["rows"][:5]},
                          "every env's last step [2, 5]"),
    "wrong dtype": (_replace(rows=lambda p: p["rows"].apply(lambda t: t.double())),
                    "expected torch.float32 [4]"),
    "wrong shape": (_replace(rows=lambda p: TensorDict(
        {"observation": torch.zeros(6, 5)}, [6])), "expected torch.float32 [4]"),
    "unknown key": (_replace(rows=lambda p: TensorDict({"other": torch.zeros(6, 4)}, [6])),
                    "the frames have no ('other',)"),
    "a flag": (_replace(rows=lambda p: TensorDict(
        {"done": torch.zeros(6, 1, dtype=torch.bool)}, [6])), "not an observation key"),
    "twin already there": (_replace(rows=lambda p: TensorDict(
        {("next", "reward"): torch.zeros(6, 1)}, [6])), "not an observation key"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_patch_is_a_protocol_error_naming_what_came(name: str) -> None:
    wire, patch = compact_pair()
    make, words = HOSTILE[name]
    assert patch["at"].tolist() == [0, 1, 2, 3, 4, 5]  # next = obs + 100: every row ships
    body = decode(encode({"request": 1, "frames": wire, "next": make(patch)}))
    with pytest.raises(ProtocolError) as info:
        Batch.from_body(body)
    assert words in str(info.value), str(info.value)


def test_a_patch_field_beyond_at_and_rows_is_ignored_as_in_every_declared_kind() -> None:
    # A newer worker may add one; nothing reads it (the declared fields are all that is kept).
    wire, patch = compact_pair()
    want = rebuild(wire.clone(), patch)
    body = decode(encode({"request": 1, "frames": wire, "next": {**patch, "x": [1] * 9}}))
    assert_identical(Batch.from_body(body).frames, want)


def test_a_wire_patch_given_to_rebuild_is_read_by_the_same_declaration() -> None:
    wire, patch = compact_pair()
    with pytest.raises(ProtocolError, match=r"^batch field 'next' field 'rows' is missing$"):
        rebuild(wire, {"at": patch["at"]})


def test_a_raw_dict_patch_given_to_rebuild_says_what_to_pass() -> None:
    wire, patch = compact_pair()
    rows = {"observation": patch["rows"]["observation"]}  # a plain dict, not a TensorDict
    with pytest.raises(ProtocolError) as info:
        rebuild(wire.clone(), {"at": patch["at"], "rows": rows})
    assert str(info.value) == (
        "batch field 'next' 'rows' must be a TensorDict of one row per position in 'at', as "
        "compact() returns it; got a dict of keys ['observation']: pass "
        "TensorDict(rows, batch_size=[len(at)]), or compact()'s patch as it is")
    with pytest.raises(ProtocolError) as info:
        rebuild(wire.clone(), {"at": patch["at"].tolist(), "rows": patch["rows"]})
    assert str(info.value) == (
        "batch field 'next' 'at' must be a 1-d int64 tensor of flat positions n * T + t, as "
        "compact() returns it; got a list: pass torch.as_tensor(at, dtype=torch.int64), or "
        "compact()'s patch as it is")
    # Done as the text says, the same patch rebuilds the batch compact() was given.
    fixed = {"at": torch.as_tensor(patch["at"].tolist(), dtype=torch.int64),
             "rows": TensorDict(rows, batch_size=[len(patch["at"])])}
    assert_identical(rebuild(wire.clone(), fixed), rebuild(wire.clone(), patch))


def test_a_patch_for_frames_that_hold_the_twin_already_is_refused() -> None:
    wire, patch = compact_pair()
    wire.set(("next", "observation"), torch.zeros(2, 3, 4))
    with pytest.raises(ProtocolError, match=re.escape("hold ('next', *('observation',))")):
        rebuild(wire, patch)


def test_a_patch_for_frames_without_a_time_dim_is_refused() -> None:
    _, patch = compact_pair()
    with pytest.raises(ProtocolError, match=r"batch size \[6\], expected \[envs, steps\]"):
        rebuild(TensorDict({"observation": torch.zeros(6, 4)}, [6]), patch)


def test_doctests() -> None:
    assert doctest.testmod(asyncrl._protocol.compact_frames).failed == 0


def test_a_welcome_offers_compact_batches_and_one_without_the_field_does_not() -> None:
    from asyncrl._protocol import Welcome

    body = Welcome(index=0, share_frames=8, compact_batches=True).to_body()
    assert Welcome.from_body(decode(encode(body))).compact_batches is True
    del body["compact_batches"]  # a coordinator of an earlier release
    assert Welcome.from_body(body).compact_batches is False
    with pytest.raises(ProtocolError, match="compact_batches"):
        Welcome.from_body({**body, "compact_batches": "yes"})
