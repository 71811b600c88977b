"""``static_batch_size``: the served policy captured once in a CUDA graph (TorchRL's field).

The graph's bookkeeping (padding, the first ``n`` rows out, one capture, errors) runs
on the CPU with an eager stand-in for the capture. The collector with a real graph:
``test_batched_inference_process.py::test_versions_and_frames_are_exact_across_every_kind_of_update``
(it skips without CUDA).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from asyncrl import AsyncBatchedCollector
from asyncrl._inference.graphed_batch import CaptureError, GraphedDeviceBatch
from asyncrl.testing import CountingEnv, ValuePolicy

counting3 = functools.partial(CountingEnv, length=3)
CPU = torch.device("cpu")


class EagerCapture:
    """Stands in for the CUDA capture: runs once to make the static outputs, and each
    replay runs again and copies into them (what a graph replay does, eagerly)."""

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def __call__(self, run: Any, device: torch.device) -> tuple[Any, list[torch.Tensor]]:
        self.captures += 1
        outputs = [o.clone() for o in run()]

        def replay() -> None:
            self.replays += 1
            for out, new in zip(outputs, run(), strict=True):
                out.copy_(new)
        return replay, outputs


def doubled(td: TensorDictBase) -> TensorDictBase:
    return td.set("action", td["observation"].sum(-1) * 2)


def test_a_call_pads_to_the_graph_and_returns_its_own_rows() -> None:
    host = {"observation": torch.zeros(4, 3)}
    capture = EagerCapture()
    seen: list[int] = []

    def policy(td: TensorDictBase) -> TensorDictBase:
        seen.append(td.batch_size[0])  # every run is of the graph's rows
        return doubled(td)

    call = GraphedDeviceBatch(host, CPU, capacity=4, static=8, capture=capture)
    for n, value in [(2, 1.0), (4, 3.0), (1, 5.0), (3, 7.0)]:
        host["observation"][:n] = value
        out = call(n, policy, ["action"])[0]
        assert out.tolist() == [6 * value] * n
    assert capture.captures == 1 and call.captures == 1  # captured at the first call only
    assert capture.replays == 4
    assert set(seen) == {8}


def test_new_output_keys_capture_again() -> None:
    host = {"observation": torch.ones(2, 3)}
    capture = EagerCapture()
    call = GraphedDeviceBatch(host, CPU, capacity=2, static=2, capture=capture)

    def both(td: TensorDictBase) -> TensorDictBase:
        return doubled(td).set("extra", td["observation"][..., 0])

    assert call(2, both, ["action"])[0].tolist() == [6.0, 6.0]
    action, extra = call(2, both, ["action", "extra"])
    assert (action.tolist(), extra.tolist()) == ([6.0, 6.0], [1.0, 1.0])
    assert call.captures == 2


def test_a_policy_that_cannot_be_captured_is_named_with_the_way_out() -> None:
    def refuses(run: Any, device: torch.device) -> Any:
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    call = GraphedDeviceBatch({"observation": torch.ones(2, 3)}, CPU, capacity=2, static=4,
                              capture=refuses)
    with pytest.raises(CaptureError, match=r"static_batch_size=4: the policy could not be "
                       r"captured in a CUDA graph \(RuntimeError: operation not permitted "
                       r"when stream is capturing\)\..*leave static_batch_size out"):
        call(1, doubled, ["action"])


def test_outputs_of_another_batch_size_are_refused() -> None:
    def first_row_only(td: TensorDictBase) -> TensorDictBase:
        return TensorDict({"action": td["observation"][:1].sum(-1)}, batch_size=[1])

    call = GraphedDeviceBatch({"observation": torch.ones(2, 3)}, CPU, capacity=2, static=4,
                              capture=EagerCapture())
    with pytest.raises(CaptureError, match=r"the graphed policy's 'action' must be a tensor "
                       r"of 4 rows on cpu, got \(1,\) on cpu"):
        call(2, first_row_only, ["action"])


def test_the_graph_holds_at_least_max_batch_size_rows() -> None:
    with pytest.raises(ValueError, match="static_batch_size=2 is smaller than max_batch_size=4"):
        GraphedDeviceBatch({"observation": torch.ones(4, 3)}, CPU, capacity=4, static=2)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"static_batch_size": 4, "max_batch_size": 8},
     r"static_batch_size=4 is smaller than max_batch_size=8: every call is padded"),
    ({"static_batch_size": 8},
     r"static_batch_size=8 captures the served policy in a CUDA graph: it needs "
     r"device='cuda' \(the policy's device\), got device=None"),
    ({"static_batch_size": 8, "device": "cpu"}, r"got device='cpu'"),
    ({"server_config": "InferenceServerConfig(static_batch_size=64)"},
     r"static_batch_size=64 captures the served policy in a CUDA graph"),
    ({"server_config": "InferenceServerConfig()", "static_batch_size": 64},
     "mutually exclusive"),
    ({"static_batch_size": 0}, "static_batch_size"),
])
def test_static_batch_size_is_checked(kwargs: dict[str, Any], match: str) -> None:
    from torchrl.modules.inference_server import InferenceServerConfig  # noqa: F401 (eval)

    if "server_config" in kwargs:
        kwargs = {**kwargs, "server_config": eval(kwargs["server_config"])}
    with pytest.raises(ValueError, match=match):
        AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(), frames_per_batch=4,
                              **kwargs)
