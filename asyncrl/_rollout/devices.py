"""The collectors' four devices, with TorchRL's meaning (``device`` and its three defaults).

A collector resolves the four arguments once, in its constructor, into a
:class:`DeviceLayout` (TorchRL 0.14's rules: ``device`` fills the three others;
``"cuda"`` becomes ``"cuda:<current>"``; an unset ``storing_device`` is the
env/policy device when the two coincide). Each device is checked on the machine
that will use it: a device this machine lacks (``"cuda"`` without CUDA,
``"cuda:3"`` with one GPU, ``"mps"`` off a Mac) is a ``ValueError`` that names
the argument, never a silent fallback to the CPU and never a crash in a worker.

asyncrl's env pools step on the host (gymnasium envs give numpy arrays), so a
worker's envs always write host memory; ``env_device`` may be the host or the
policy's device (observations are then moved there once per step, which is the
policy's own copy). See ``docs/devices.md``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from torch import nn

__all__ = ["HOST", "DeviceLayout", "DeviceLike", "check_device", "place_policy"]

DeviceLike: TypeAlias = torch.device | str | int | None

#: Where env pools write and where batches cross process boundaries (bytes on the wire).
HOST = torch.device("cpu")

_NAMES = ("device", "policy_device", "env_device", "storing_device")


def check_device(name: str, value: Any) -> torch.device | None:
    """``value`` as a ``torch.device`` this machine has (None stays None), or a ValueError.

    ``name`` is the argument as the user spelled it; the message says what came
    and what to do.

    >>> check_device("storing_device", "cpu")
    device(type='cpu')
    >>> check_device("device", "meta")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: device='meta': a meta tensor holds no data, ...
    """
    if value is None:
        return None
    if isinstance(value, list | tuple):
        raise ValueError(
            f"{name}={value!r}: one device for every worker is supported, not a list per "
            "worker; to run some workers on other devices, start them on their host with "
            "`asyncrl worker --device DEVICE` (MultiCollector(listen=..., remote_workers=N))")
    if isinstance(value, bool) or not isinstance(value, torch.device | str | int):
        raise ValueError(f"{name} must be a torch.device, a device name such as 'cpu' or "
                         f"'cuda:0', or a CUDA index; got {type(value).__name__} {value!r}")
    try:
        device = value if isinstance(value, torch.device) else torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{name}={value!r} is not a device: expected a torch.device or a "
                         f"device name such as 'cpu' or 'cuda:0' ({exc})") from None
    _check_available(name, value, device)
    return device


def _check_available(name: str, value: Any, device: torch.device) -> None:
    kind = device.type
    if kind == "cpu":
        return
    if kind == "meta":
        raise ValueError(f"{name}={value!r}: a meta tensor holds no data, so nothing can run "
                         "or be stored there; use 'cpu' or an accelerator this machine has "
                         "(e.g. 'cuda:0')")
    if kind == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else \
                f"built for CUDA {torch.version.cuda}, but no GPU is visible"
            raise ValueError(
                f"{name}={value!r} but this machine has no CUDA device (torch "
                f"{torch.__version__}: {build}): pass {name}='cpu' or leave it unset, or run "
                "on a machine with a GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)")
        _check_index(name, value, device, torch.cuda.device_count())
        return
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{name}={value!r} but MPS (Apple GPUs) is not available on this "
                             f"machine: pass {name}='cpu' or leave it unset")
        _check_index(name, value, device, 1)
        return
    accelerator = torch.accelerator.current_accelerator() \
        if torch.accelerator.is_available() else None
    if accelerator is None or accelerator.type != kind:
        have = f"its accelerator is {accelerator.type!r}" if accelerator else "it has none"
        raise ValueError(f"{name}={value!r}: device type {kind!r} is not available on this "
                         f"machine ({have}); use 'cpu' or the machine's accelerator")
    _check_index(name, value, device, torch.accelerator.device_count())


def _check_index(name: str, value: Any, device: torch.device, count: int) -> None:
    if device.index is not None and device.index >= count:
        raise ValueError(f"{name}={value!r} but this machine has {count} {device.type} "
                         f"device(s) (indices 0..{count - 1}): pick one of them")


def _ordinal(device: torch.device | None) -> torch.device | None:
    """TorchRL's ``_make_ordinal_device``: ``cuda`` -> ``cuda:<current>``, ``mps`` -> ``mps:0``."""
    if device is None or device.index is not None:
        return device
    if device.type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "mps":
        return torch.device("mps", 0)
    return device


def _same(a: torch.device | None, b: torch.device | None) -> bool:
    """Same memory: None and the CPU are both host memory."""
    return (a or HOST) == (b or HOST)


@dataclass(frozen=True)
class DeviceLayout:
    """Where a collector's policy runs, its env outputs live and its batches are stored.

    Built once per collector with :meth:`resolve` (TorchRL's rules, every
    device checked on this machine). None means "not set": the host for the
    policy's inputs and the envs, "leave the batch where it is" for storing.

    >>> layout = DeviceLayout.resolve(device="cpu")
    >>> layout.policy_device, layout.env_device, layout.storing_device
    (device(type='cpu'), device(type='cpu'), device(type='cpu'))
    >>> DeviceLayout.resolve(policy_device="cpu").storing_device   # env unset: not the same
    >>> DeviceLayout.resolve(policy_device="cpu", env_device="cpu").storing_device
    device(type='cpu')
    """

    policy_device: torch.device | None = None
    env_device: torch.device | None = None
    storing_device: torch.device | None = None

    @classmethod
    def resolve(cls, *, device: Any = None, policy_device: Any = None, env_device: Any = None,
                storing_device: Any = None) -> DeviceLayout:
        """The four collector arguments, checked and resolved as TorchRL 0.14 does."""
        given = dict(zip(_NAMES, (device, policy_device, env_device, storing_device),
                         strict=True))
        checked = {name: check_device(name, value) for name, value in given.items()}
        default = checked["device"]
        policy = _ordinal(checked["policy_device"] or default)
        env = _ordinal(checked["env_device"] or default)
        storing = _ordinal(checked["storing_device"] or default)
        if storing is None and env is not None and env == policy:
            storing = env
        if not _same(env, HOST) and env != policy:
            # Our env pools write host memory: only the policy's copy can put observations
            # on a device; honouring env_device alone would copy them there and back.
            raise ValueError(
                f"env_device={env} with policy_device={policy}: asyncrl's envs step on the "
                "host (numpy arrays), so their outputs can live on a device only as the "
                "policy's input. Use env_device='cpu' (or leave it None) with any "
                "policy_device, or the same device for both (device='cuda' does that)")
        return cls(policy, env, storing)

    @property
    def moves_observations(self) -> bool:
        """True when the policy runs off the host: inputs go there, actions come back."""
        return not _same(self.policy_device, HOST)

    @property
    def pins_host_buffers(self) -> bool:
        """True when host buffers feed a CUDA device (pinned: DMA copies, non_blocking)."""
        return any(d is not None and d.type == "cuda"
                   for d in (self.policy_device, self.storing_device))

    def for_worker(self) -> DeviceLayout:
        """The layout a worker process uses: its batches leave it as host bytes.

        The trainer moves what it receives to ``storing_device`` (:meth:`store`).
        """
        return DeviceLayout(self.policy_device, self.env_device, None)

    def as_options(self) -> dict[str, torch.device | None]:
        """The keyword arguments of :class:`~asyncrl._rollout.options.RolloutOptions`."""
        return {"policy_device": self.policy_device, "env_device": self.env_device,
                "storing_device": self.storing_device}

    def store(self, batch: Any) -> Any:
        """``batch`` on ``storing_device`` (as it is when unset or already there)."""
        device = self.storing_device
        if device is None or batch.device == device:
            return batch
        return batch.to(device, non_blocking=device.type == "cuda")


def place_policy(policy: Any, device: torch.device | None, *, copy_module: bool) -> Any:
    """``policy`` with its parameters and buffers on ``device``, moved once.

    A module already there is returned as is. Otherwise, with ``copy_module``
    (the in-process collector: the trainer's own module must stay where it is,
    as TorchRL's collectors do) a copy is moved; without it (a worker process's
    own policy) the module itself is moved. Callables that are not modules have
    no device: they are called with inputs on ``device``.
    """
    if device is None or not isinstance(policy, nn.Module):
        return policy
    tensors = [*policy.parameters(), *policy.buffers()]
    if all(t.device == device for t in tensors):
        return policy
    if copy_module:
        policy = copy.deepcopy(policy)
    return policy.to(device)
