"""A plain TensorDictModule called directly gives what tensordict's own call gives."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import ProbabilisticTensorDictModule, TensorDictModule, set_skip_existing
from torch import nn

from asyncrl._rollout.policies import PolicyAdapter
from asyncrl._rollout.td_module_direct import direct_call


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 4)

    def forward(self, obs: torch.Tensor, extra: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.net(obs) + extra
        return h[..., :2], h[..., 2:].sum(-1, keepdim=True)


class DictOut(nn.Module):
    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"b": obs * 2, "a": obs + 1}


def step_td() -> TensorDict:
    torch.manual_seed(0)
    return TensorDict({"observation": torch.randn(5, 3), "extra": torch.randn(5, 1),
                       ("nested", "obs"): torch.randn(5, 3)}, [5])


MODULES = {
    "one output": lambda: TensorDictModule(nn.Linear(3, 2), ["observation"], ["action"]),
    "two inputs, tuple out": lambda: TensorDictModule(TwoHeads(), ["observation", "extra"],
                                                      ["action", "value"]),
    "nested keys": lambda: TensorDictModule(nn.Linear(3, 2), [("nested", "obs")],
                                            [("out", "action")]),
    "dict out": lambda: TensorDictModule(DictOut(), ["observation"], ["a", "b"]),
    "ignored output": lambda: TensorDictModule(TwoHeads(), ["observation", "extra"],
                                               ["action", "_"]),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_the_direct_call_writes_exactly_what_the_module_writes(name) -> None:
    module = MODULES[name]()
    call = direct_call(module)
    assert call is not None
    expected, got = module(step_td()), call(step_td())
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        assert torch.equal(got[key], expected[key]), key


def test_the_adapter_takes_the_direct_call_and_keeps_results() -> None:
    module = MODULES["two inputs, tuple out"]()
    adapter = PolicyAdapter(module, observation_keys=["observation", "extra"])
    assert adapter._direct is not None
    with adapter.exploration():
        got = adapter(step_td())
    assert torch.equal(got["value"], module(step_td())["value"])


@pytest.mark.parametrize("make", [
    lambda: TensorDictModule(nn.Linear(3, 2), ["observation"], ["action"], inplace=False),
    lambda: TensorDictModule(nn.Linear(3, 2), ["observation"], ["action"], method="forward"),
    lambda: ProbabilisticTensorDictModule(in_keys=["loc", "scale"], out_keys=["action"]),
    lambda: type("Sub", (TensorDictModule,), {})(nn.Linear(3, 2), ["observation"],
                                                  ["action"]),
])
def test_modules_that_do_more_keep_their_own_path(make) -> None:
    assert direct_call(make()) is None


def test_hooks_and_skip_existing_set_later_take_the_modules_own_path() -> None:
    module = MODULES["one output"]()
    call = direct_call(module)
    assert call is not None
    seen = []
    handle = module.register_forward_hook(lambda m, args, out: seen.append(type(out)))
    call(step_td())
    assert seen == [TensorDict]  # the hook ran: the module's own call was made
    handle.remove()
    global_handle = nn.modules.module.register_module_forward_hook(
        lambda m, args, out: seen.append(m))
    try:
        call(step_td())
    finally:
        global_handle.remove()
    assert module in seen
    td = step_td().set("action", torch.full((5, 2), 7.0))
    with set_skip_existing(True):
        out = call(td)
    assert (out["action"] == 7).all()  # skipped, as the module itself does


def test_a_wrong_number_of_outputs_is_an_error_naming_the_keys() -> None:
    module = TensorDictModule(nn.Linear(3, 2), ["observation"], ["action", "value"])
    with pytest.raises(RuntimeError, match=r"Linear returned 1 tensors for the out_keys "
                                           r"\['action', 'value'\]"):
        direct_call(module)(step_td())


class Doubled(nn.Module):
    """A layer whose __call__ does more than forward: the unrolled run must call it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x) * 2


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Sequential(nn.Linear(8, 2), nn.Tanh()))


def test_a_sequential_run_layer_by_layer_gives_what_it_gives_and_runs_hooks_added_later(
) -> None:
    net = mlp()
    module = TensorDictModule(net, ["observation"], ["action"])
    call, td = direct_call(module), step_td()
    assert call is not None
    want = net(td["observation"])
    assert torch.equal(call(td.clone())["action"], want)
    seen: list[str] = []
    net[1].register_forward_hook(lambda *_: seen.append("layer"))
    net[2][0].register_forward_pre_hook(lambda *_: seen.append("nested"))
    assert torch.equal(call(td.clone())["action"], want)
    assert seen == ["layer", "nested"]
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda *_: seen.append("global"))
    try:
        call(td.clone())
        by_call = seen.count("global")
        module(td.clone())
    finally:
        handle.remove()
    assert by_call == seen.count("global") - by_call == 7  # the module, net, its 5 layers


def test_a_sequential_layer_with_its_own_call_is_called() -> None:
    net = nn.Sequential(nn.Linear(3, 2), Doubled())
    module = TensorDictModule(net, ["observation"], ["action"])
    call, td = direct_call(module), step_td()
    assert call is not None
    assert torch.equal(call(td.clone())["action"], net(td["observation"]))
    assert torch.equal(call(td.clone())["action"], net[0](td["observation"]) * 2)
