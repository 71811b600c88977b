"""WeightStrategy and model paths: formats, nested and dotted keys, mismatch messages."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from asyncrl.weights import (
    ModelPathError,
    WeightMismatchError,
    WeightStrategy,
    resolve_model_path,
)
from asyncrl.weights._paths import parse_model_path
from asyncrl.weights._strategy import clone_weights, flat_tensors


def make_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Sequential(nn.Linear(4, 2)))


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("extract_as", ["tensordict", "state_dict"])
def test_module_to_module_in_both_formats(extract_as: str) -> None:
    src, dst = make_net(0), make_net(1)
    strategy = WeightStrategy(extract_as)  # type: ignore[arg-type]
    weights = strategy.extract_weights(src)
    if extract_as == "tensordict":
        assert isinstance(weights, TensorDict)
        assert weights["2", "0", "weight"].shape == (2, 4)  # nested, not dotted
    else:
        assert isinstance(weights, dict) and "2.0.weight" in weights
    dst_weight = dst[0].weight
    assert strategy.apply_weights(dst, weights) is dst
    assert_same_weights(src, dst)
    assert dst[0].weight is dst_weight  # copied in place: the parameter keeps its identity


@pytest.mark.parametrize("extract_as", ["tensordict", "state_dict"])
@pytest.mark.parametrize("arriving", ["tensordict", "flat", "nested_dict", "module"])
def test_apply_detects_the_arriving_format(extract_as: str, arriving: str) -> None:
    src, dst = make_net(0), make_net(1)
    flat = src.state_dict()
    weights = {
        "tensordict": TensorDict.from_module(src),
        "flat": flat,
        "nested_dict": {"0": {"weight": flat["0.weight"], "bias": flat["0.bias"]},
                        "1": {k.split(".", 1)[1]: v for k, v in flat.items()
                              if k.startswith("1.")},
                        "2.0": {"weight": flat["2.0.weight"], "bias": flat["2.0.bias"]}},
        "module": src,
    }[arriving]
    WeightStrategy(extract_as).apply_weights(dst, weights)  # type: ignore[arg-type]
    assert_same_weights(src, dst)


def test_destinations_tensordict_and_state_dict_are_updated_in_place() -> None:
    src = make_net(0)
    td_dest = TensorDict.from_module(make_net(1)).clone()
    WeightStrategy().apply_weights(td_dest, src)
    assert torch.equal(td_dest["2", "0", "weight"], src[2][0].weight)
    sd_dest = {k: v.clone() for k, v in make_net(1).state_dict().items()}
    keep = sd_dest["0.weight"]
    WeightStrategy().apply_weights(sd_dest, TensorDict.from_module(src))
    assert sd_dest["0.weight"] is keep and torch.equal(keep, src[0].weight)


def test_mismatch_lists_missing_unexpected_and_wrongly_shaped_keys_and_applies_nothing() -> None:
    dst = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    weights = {
        "0.weight": torch.zeros(4, 3),  # fine
        "0.bias": torch.zeros(5),  # wrong shape
        "1.weight": torch.zeros(2, 4),  # fine; 1.bias missing
        "2.weight": torch.zeros(1),  # unexpected
    }
    with pytest.raises(WeightMismatchError) as info:
        WeightStrategy().apply_weights(dst, weights)
    err = info.value
    assert err.missing == ["1.bias"]
    assert err.unexpected == ["2.weight"]
    assert err.wrong_shape == [("0.bias", (4,), (5,))]
    text = str(err)
    assert "missing keys" in text and "1.bias" in text
    assert "unexpected keys" in text and "2.weight" in text
    assert "0.bias (expected [4], got [5])" in text
    assert "nothing was applied" in text
    for key, value in dst.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} changed although the apply failed"


def test_non_strict_skips_extra_and_missing_keys_but_not_shapes() -> None:
    dst = nn.Linear(2, 2)
    WeightStrategy().apply_weights(dst, {"weight": torch.ones(2, 2), "extra": torch.ones(1)},
                                   strict=False)
    assert torch.equal(dst.weight, torch.ones(2, 2))
    with pytest.raises(WeightMismatchError, match="wrongly shaped"):
        WeightStrategy().apply_weights(dst, {"weight": torch.ones(3)}, strict=False)


def test_long_mismatch_lists_are_truncated() -> None:
    weights = {f"w{i}": torch.zeros(1) for i in range(50)}
    with pytest.raises(WeightMismatchError, match=r"and 30 more"):
        WeightStrategy().apply_weights({}, weights)


def test_same_memory_is_not_copied() -> None:
    net = nn.Linear(2, 2)
    # extracting and applying to the very same module is a no-op, not an aliasing copy
    WeightStrategy().apply_weights(net, WeightStrategy().extract_weights(net))


def test_dtype_is_converted_like_load_state_dict() -> None:
    net = nn.Linear(2, 1)
    WeightStrategy().apply_weights(net, {"weight": torch.ones(1, 2, dtype=torch.float64),
                                         "bias": torch.zeros(1, dtype=torch.float16)})
    assert net.weight.dtype == torch.float32 and float(net.weight.detach().sum()) == 2.0


def test_unsupported_objects_raise_type_error() -> None:
    with pytest.raises(TypeError, match=r"nn\.Module, a TensorDict or a state dict"):
        WeightStrategy().apply_weights(object(), {})
    with pytest.raises(ValueError, match="tensordict"):
        WeightStrategy("pickle")  # type: ignore[arg-type]


def test_clone_weights_is_private_memory() -> None:
    net = nn.Linear(2, 2)
    for weights in (WeightStrategy().extract_weights(net),
                    WeightStrategy("state_dict").extract_weights(net)):
        copy = clone_weights(weights)
        for key, tensor in flat_tensors(copy).items():
            assert tensor.data_ptr() != flat_tensors(net)[key].data_ptr()


# ------------------------------------------------------------------ model paths


class Root:
    def __init__(self) -> None:
        self.policy = nn.Linear(1, 1)
        self.critic = nn.Sequential(nn.Identity(), nn.Linear(2, 2))
        self.critic.module = nn.ModuleList([nn.Identity(), nn.Linear(3, 3)])
        self.env = type("Env", (), {})()
        self.env.transform = [nn.Linear(4, 4)]
        self.extra = {"norm": nn.Linear(5, 5)}


@pytest.mark.parametrize(("path", "in_features"), [
    ("policy", 1), ("critic[1]", 2), ("critic.module[1]", 3), ("env.transform[0]", 4),
    ("extra['norm']", 5), ('extra["norm"]', 5), ("env.transform[-1]", 4),
])
def test_model_paths_resolve(path: str, in_features: int) -> None:
    assert resolve_model_path(Root(), path).in_features == in_features


@pytest.mark.parametrize("path", ["", "policy..x", "policy[", "1abc", "policy x", ".policy",
                                  "policy[a]"])
def test_malformed_paths_are_rejected(path: str) -> None:
    with pytest.raises(ModelPathError):
        parse_model_path(path)


@pytest.mark.parametrize(("path", "where"), [
    ("value_net", "attribute 'value_net'"),
    ("env.transform[3]", "item [3]"),
    ("extra['nope']", "key 'nope'"),
])
def test_unresolvable_paths_say_where_they_stopped(path: str, where: str) -> None:
    with pytest.raises(ModelPathError, match=r"does not resolve") as info:
        resolve_model_path(Root(), path)
    assert where in str(info.value)
