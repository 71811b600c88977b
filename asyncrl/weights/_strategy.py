"""How weights are taken from a model and put back: ``WeightStrategy``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from transports import copy_into

from ._errors import WeightMismatchError

__all__ = ["WeightStrategy", "as_strategy", "check_compatible", "clone_weights", "flat_tensors"]

WeightFormat = Literal["tensordict", "state_dict"]


class WeightStrategy:
    """Extract weights from a model and apply them to another, in a given format.

    ``extract_as="tensordict"`` gives a nested :class:`~tensordict.TensorDict`,
    ``"state_dict"`` a flat ``{"dotted.key": tensor}`` dict. Sources and
    destinations may be an ``nn.Module``, a TensorDict or a (nested or
    dotted) state dict, whatever the format: :meth:`apply_weights` detects what
    arrived. Weights are copied in place, so the destination keeps its identity
    (compiled modules, optimizers and rollouts holding it see the new values).

    >>> src, dst = nn.Linear(2, 2), nn.Linear(2, 2)
    >>> strategy = WeightStrategy("state_dict")
    >>> weights = strategy.extract_weights(src)
    >>> sorted(weights)
    ['bias', 'weight']
    >>> _ = strategy.apply_weights(dst, weights)
    >>> bool(torch.equal(dst.weight, src.weight))
    True
    """

    def __init__(self, extract_as: WeightFormat = "tensordict") -> None:
        if extract_as not in ("tensordict", "state_dict"):
            raise ValueError(f"extract_as must be 'tensordict' or 'state_dict', got {extract_as!r}")
        self.extract_as: WeightFormat = extract_as

    def __repr__(self) -> str:
        return f"WeightStrategy({self.extract_as!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WeightStrategy) and other.extract_as == self.extract_as

    def __hash__(self) -> int:
        return hash(self.extract_as)

    def extract_weights(self, source: Any) -> TensorDictBase | dict[str, torch.Tensor]:
        """Weights of ``source`` (module, TensorDict or state dict), in this strategy's format.

        Tensors are detached but not copied: they share memory with ``source``.
        """
        if self.extract_as == "state_dict":
            return flat_tensors(source)
        if isinstance(source, TensorDictBase):
            return source
        return TensorDict(_unflatten(flat_tensors(source)), batch_size=[])

    def apply_weights(self, destination: Any, weights: Any, *, strict: bool = True) -> Any:
        """Copy ``weights`` into ``destination`` in place and return ``destination``.

        With ``strict`` (the default) keys and shapes must match exactly, else
        :class:`WeightMismatchError` lists the differences and nothing is copied.
        Without it, keys present on one side only are skipped (shapes must still
        match). Dtypes are converted as ``load_state_dict`` does.
        """
        targets = flat_tensors(destination, live=True)
        sources = flat_tensors(weights)
        check_compatible(targets, sources, strict=strict)
        for key, src in sources.items():
            dst = targets.get(key)
            if dst is None or _same_memory(dst, src):
                continue  # same storage (in-process, same object): nothing to copy
            copy_into(dst, src)
        return destination


def as_strategy(strategy: WeightStrategy | str) -> WeightStrategy:
    """``strategy`` itself, or a new one for a format name."""
    return strategy if isinstance(strategy, WeightStrategy) else WeightStrategy(strategy)  # type: ignore[arg-type]


def check_compatible(
    targets: Mapping[str, torch.Tensor],
    sources: Mapping[str, Any],
    *,
    strict: bool = True,
    what: str = "weights",
    dtypes: bool = False,
) -> None:
    """Raise :class:`WeightMismatchError` unless ``sources`` fit ``targets``.

    ``dtypes``: a source's ``dtype`` must be its target's too (bytes copied as they
    are: no conversion); else dtypes are converted, as ``load_state_dict`` does.
    """
    missing = [k for k in targets if k not in sources] if strict else []
    unexpected = [k for k in sources if k not in targets] if strict else []
    wrong = [
        (k, tuple(targets[k].shape), tuple(_shape(v)))
        for k, v in sources.items()
        if k in targets and tuple(targets[k].shape) != tuple(_shape(v))
    ]
    wrong_dtype = [
        (k, _dtype_name(targets[k].dtype), _dtype_name(getattr(v, "dtype", None)))
        for k, v in sources.items()
        if dtypes and k in targets and getattr(v, "dtype", None) != targets[k].dtype
    ]
    if missing or unexpected or wrong or wrong_dtype:
        raise WeightMismatchError(missing=missing, unexpected=unexpected, wrong_shape=wrong,
                                  wrong_dtype=wrong_dtype, what=what)


def flat_tensors(obj: Any, *, live: bool = False) -> dict[str, torch.Tensor]:
    """``{"dotted.key": tensor}`` for a module, a TensorDict or a (nested) mapping.

    ``live`` keeps module parameters as they are (to copy into them); otherwise
    tensors are detached. Non-tensor entries (``_extra_state``, strings) are skipped.
    """
    if isinstance(obj, nn.Module):
        state = obj.state_dict(keep_vars=live)
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if isinstance(obj, TensorDictBase):
        flat = {}
        for key, value in obj.items(include_nested=True, leaves_only=True):
            if isinstance(value, torch.Tensor) and not isinstance(value, TensorDictBase):
                name = ".".join(key) if isinstance(key, tuple) else key
                flat[name] = value if live else value.detach()
        return flat
    if isinstance(obj, Mapping):
        flat = {}
        _flatten_mapping(obj, "", flat, live)
        return flat
    raise TypeError(
        f"cannot take weights from or apply weights to a {type(obj).__qualname__}: expected "
        "an nn.Module, a TensorDict or a state dict"
    )


def clone_weights(weights: Any) -> Any:
    """A private copy of ``weights`` (same structure), safe to send while the model trains."""
    if isinstance(weights, TensorDictBase):
        return weights.detach().apply(_clone_tensor)
    if isinstance(weights, Mapping):
        return {k: clone_weights(v) for k, v in weights.items()}
    if isinstance(weights, torch.Tensor):
        return _clone_tensor(weights)
    return weights


def _clone_tensor(tensor: torch.Tensor) -> torch.Tensor:
    out = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    copy_into(out, tensor)
    return out


def _flatten_mapping(obj: Mapping[Any, Any], prefix: str, out: dict[str, torch.Tensor],
                     live: bool) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, TensorDictBase):
            for sub, tensor in flat_tensors(value, live=live).items():
                out[f"{name}.{sub}"] = tensor
        elif isinstance(value, Mapping):
            _flatten_mapping(value, name + ".", out, live)
        elif isinstance(value, torch.Tensor):
            out[name] = value if live else value.detach()


def _unflatten(flat: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"key {key!r} nests under {part!r}, which is a tensor")
            node = child
        if isinstance(node.get(leaf), dict):
            raise ValueError(f"key {key!r} is both a tensor and a prefix of other keys")
        node[leaf] = value
    return nested


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(value.shape) if hasattr(value, "shape") else ()


def _same_memory(dst: torch.Tensor, src: torch.Tensor) -> bool:
    return (
        dst.data_ptr() == src.data_ptr()
        and dst.dtype == src.dtype
        and dst.device == src.device
        and dst.stride() == src.stride()
    )
