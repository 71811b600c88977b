"""The local path's copies with no call into the blocks (issue #25, ``_inference.block_io``).

The inference loop gathers requests and writes answers through preallocated
arrays and the blocks' sequence words; a policy on another device goes through
``DeviceBatch``. What must hold: each worker gets exactly its rows' answers and
the call's version, whatever the order of the requests in the batch, on both paths.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl._inference.block_io import SlotArrays
from asyncrl._inference.device_batch import DeviceBatch
from asyncrl._inference.doorbell import EventFd
from asyncrl._inference.inference_loop import InferenceLoop
from asyncrl._inference.outputs import discover_outputs
from asyncrl._inference.worker_blocks import lane, make_blocks
from asyncrl._rollout.policies import PolicyAdapter

OBS = ("observation",)


def _policy() -> TensorDictModule:
    torch.manual_seed(0)
    return TensorDictModule(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)),
                            in_keys=["observation"], out_keys=["action"])


@contextlib.contextmanager
def _serving(policy, rows, *, device_batch: bool):
    """A loop serving ``policy`` to workers of ``rows`` envs: (loop, blocks, requests).

    ``device_batch``: the GPU path's code (``DeviceBatch``), on the CPU.
    """
    adapter = PolicyAdapter(policy, observation_keys=["observation"])
    outputs = discover_outputs(adapter, {OBS: torch.zeros(1, 3)}, (torch.float32, (1,)))
    blocks = make_blocks(list(rows), {OBS: torch.zeros(1, 3)}, outputs)
    bells = {slot: EventFd() for slot in blocks}
    loop = InferenceLoop(adapter, blocks, obs_paths=[OBS], outputs=outputs, device=None,
                         max_batch_size=8, min_batch_size=1, server_timeout=0.01,
                         answer_bells=bells)
    if device_batch:
        loop._device_batch = DeviceBatch({"observation": loop._obs["o0"]}, torch.device("cpu"),
                                         capacity=8)
    requests = [SlotArrays(blocks[slot].obs) for slot in blocks]
    try:
        yield loop, blocks, requests
    finally:
        close_all(requests, loop, blocks, bells.values())



def close_all(requests: list, loop: InferenceLoop, blocks: dict, bells) -> None:
    """Release the workers' request views, then the loop, the blocks and the bells."""
    for request in requests:
        request.release()
    loop.close()
    for b in blocks.values():
        b.close()
    for bell in bells:
        bell.close()

@pytest.mark.parametrize("device_batch", [False, True])
def test_each_worker_gets_its_own_rows_and_the_calls_version(device_batch) -> None:
    policy = _policy()
    with _serving(policy, [2, 1, 3], device_batch=device_batch) as (loop, blocks, requests):
        for version, order in [(3, [2, 0, 1]), (4, [1, 2, 0]), (5, [0, 2])]:
            obs = {slot: torch.randn(blocks[slot].rows, 3) for slot in blocks}
            for slot, request in enumerate(requests):
                request.publish(request.copies_from([obs[slot].numpy()]), version=0)
            with torch.no_grad():
                assert loop._serve([lane(s) for s in order], version) == sum(
                    blocks[s].rows for s in order)
                for slot in order:
                    got_version, got = blocks[slot].act.read(0)
                    assert got_version == version
                    assert torch.allclose(got["action"], policy.module(obs[slot]))
        assert blocks[1].act.read(0)[0] == 4  # not in the last call: its answer stays


def test_a_write_moves_the_sequence_by_two_and_mends_a_dead_writers_odd_number() -> None:
    blocks = make_blocks([2], {OBS: torch.zeros(1, 3)},
                         discover_outputs(PolicyAdapter(_policy()), {OBS: torch.zeros(1, 3)},
                                          (torch.float32, (1,))))
    slot = SlotArrays(blocks[0].obs)
    try:
        copies = slot.copies_from([torch.ones(2, 3).numpy()])
        assert slot.publish(copies, version=1) == 2
        slot.word[0] = 3  # a writer died mid-write
        assert slot.publish(copies, version=2) == 6
        version, read = blocks[0].obs.read(0)
        assert version == 2 and read["o0"].tolist() == [[1.0] * 3] * 2
        with pytest.raises(ValueError, match="2 sources for the block's 1 tensors"):
            slot.copies_from([torch.ones(2, 3).numpy()] * 2)
    finally:
        slot.release()
        blocks[0].close()


class _Halves(nn.Module):
    """A plain module (no TensorDict): half of each observation's sum."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.sum(-1, keepdim=True) / 2


def _serve_once(policy, *, device_batch: bool, rows=(2, 1)) -> dict[int, torch.Tensor]:
    """One call of a fresh loop over workers of ``rows`` envs: each worker's answer."""
    with _serving(policy, rows, device_batch=device_batch) as (loop, blocks, requests):
        for slot, request in enumerate(requests):
            obs = torch.arange(3.0).repeat(blocks[slot].rows, 1) + slot
            request.publish(request.copies_from([obs.numpy()]), version=0)
        with torch.no_grad():
            loop._serve([lane(s) for s in blocks], 7)
        return {slot: blocks[slot].act.read(0)[1]["action"] for slot in blocks}


@pytest.mark.parametrize("device_batch", [False, True])
def test_a_one_observation_policy_is_called_on_the_tensor_and_answers_the_same(
        device_batch) -> None:
    # sums 3, 6 (slot 0, +0) and 6 (slot 1, +1): (0+1+2)/2, ((1+2+3))/2
    expected = {0: [[1.5], [1.5]], 1: [[3.0]]}
    module = TensorDictModule(_Halves(), in_keys=["observation"], out_keys=["action"])
    assert PolicyAdapter(module).tensor_call() is not None  # the fast path is taken
    answers = _serve_once(module, device_batch=device_batch)
    assert {s: a.tolist() for s, a in answers.items()} == expected
    # a plain module, too
    assert {s: a.tolist() for s, a in _serve_once(
        _Halves(), device_batch=device_batch).items()} == expected
    # a hook added to the TensorDictModule: its own path runs, and the hook with it
    calls = []
    module.register_forward_hook(lambda *args: calls.append(1))
    answers = _serve_once(module, device_batch=device_batch)
    assert {s: a.tolist() for s, a in answers.items()} == expected and len(calls) == 2


class _WrongRows(nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0] + 1, 1) if obs.shape[0] > 1 else torch.zeros(1, 1)


@pytest.mark.parametrize("device_batch", [False, True])
def test_an_action_of_the_wrong_shape_is_named(device_batch) -> None:
    with pytest.raises(ValueError, match=r"the policy returned a tensor of shape \(4, 1\) for a "
                                         r"batch of 3 observations: expected an action tensor "
                                         r"of shape \(3, 1\)"):
        _serve_once(_WrongRows(), device_batch=device_batch)


def test_policies_the_tensor_path_cannot_serve_keep_the_tensordict_path() -> None:
    two_outputs = TensorDictModule(nn.Linear(3, 2), in_keys=["observation"],
                                   out_keys=["action"])
    assert PolicyAdapter(two_outputs, action_key="other").tensor_call() is None
    assert PolicyAdapter(two_outputs, observation_keys=["a", "b"]).tensor_call() is None
    assert PolicyAdapter(TensorDictModule(nn.Linear(3, 1), in_keys=["other"],
                                          out_keys=["action"])).tensor_call() is None
    assert PolicyAdapter(lambda td: td).tensor_call() is None  # a td -> td callable


def test_a_worker_answered_for_several_splits_in_one_call_is_rung_once() -> None:
    adapter = PolicyAdapter(_policy(), observation_keys=["observation"])
    outputs = discover_outputs(adapter, {OBS: torch.zeros(1, 3)}, (torch.float32, (1,)))
    obs = {OBS: torch.zeros(1, 3)}
    # a local worker of 4 envs in 2 splits; slot 1 plays a remote worker (through submit())
    blocks = {**make_blocks([4], obs, outputs, splits=2), 1: make_blocks([2], obs, outputs)[0]}
    bells = {0: EventFd()}
    loop = InferenceLoop(adapter, blocks, obs_paths=[OBS], outputs=outputs, device=None,
                         max_batch_size=8, min_batch_size=1, server_timeout=0.01,
                         answer_bells=bells)
    requests = [SlotArrays(blocks[0].obs, k) for k in range(2)]
    try:
        for step, request in enumerate(requests):
            request.publish(request.copies_from([torch.ones(2, 3).numpy()]), version=step)
        loop.submit(1)
        # one scan queues the local worker's splits oldest first, then the remote request
        assert loop._scan() and list(loop._pending) == [lane(0, 0), lane(0, 1), lane(1)]
        lanes = loop._next_requests()
        assert lanes == [lane(0, 0), lane(0, 1), lane(1)]
        with torch.no_grad():
            assert loop._serve(lanes, 3) == 6
        loop._calls += 1
        loop._answer(lanes, 3)
        assert os.eventfd_read(bells[0].fd) == 1  # each split checks its own answer
        assert [blocks[0].act.read(k)[0] for k in range(2)] == [3, 3]
    finally:
        close_all(requests, loop, blocks, [bells[0]])
