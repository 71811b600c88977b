"""Call a plain ``TensorDictModule`` without tensordict's per-call machinery.

A ``TensorDictModule(net, in_keys, out_keys)`` reads its inputs, calls ``net``
and writes the outputs. Around that, tensordict 0.14 runs a dispatch wrapper, a
``skip_existing`` wrapper, an out-keys filter, error wrapping, and
``TensorDict.from_any`` on every output, which probes ``find_spec("pandas")``
each time. For a small network that costs more than the network: measured on
the central inference loop (MLP-64, Pendulum), 0.28 ms per call of which the
network was 0.09 ms (``benchmarks/LOG.md``).

:func:`direct_call` returns a function doing only what such a module does, for
the modules where that is all it does: exactly ``TensorDictModule`` (no
subclass: a ``ProbabilisticActor`` or ``SafeModule`` keeps its own path), in
place, no ``method`` / ``method_kwargs`` / keyword inputs, the out keys it
writes being its out keys. Each call still checks what can change after
construction (hooks on the module, global module hooks, ``set_skip_existing``),
and takes tensordict's own path when any is set.

A network that is exactly ``nn.Sequential`` is run as its own ``forward`` runs it,
layer after layer, each layer's ``forward`` called directly where ``layer(x)`` would
do only that (no hooks of its own or global, not compiled, ``__call__`` not
overridden, not tracing): ``nn.Module.__call__`` costs about 1 us a layer, a third
of an MLP-64's forward at batch 8 (`run_sequential`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, skip_existing
from torch import nn
from torch.nn.modules import module as _torch_module

__all__ = ["DirectCall", "direct_call", "run_sequential"]

#: torch's process-wide module hooks (dicts torch fills in place): any of them set, the
#: module's own path runs.
_GLOBAL_HOOKS = tuple(getattr(_torch_module, name, {}) for name in (
    "_global_forward_hooks", "_global_forward_pre_hooks",
    "_global_backward_hooks", "_global_backward_pre_hooks"))


_MODULE_CALL = nn.Module.__call__
#: Documented (``torch.jit.is_tracing``) but not in its stubs' exports.
_is_tracing: Callable[[], bool] = torch.jit.is_tracing  # type: ignore[attr-defined]


def _hooked(module: nn.Module) -> bool:
    # Checked at every call (hooks may be added later); no allocation on the way.
    return _own_hooks(module) or _global_hooks()


def _own_hooks(m: nn.Module) -> bool:
    # torch has no public way to ask whether a module has hooks: its hook dicts are read in
    # place (and a compiled module's call is its compiled one).
    return bool(m._forward_hooks or m._forward_pre_hooks  # noqa: SLF001
                or m._backward_hooks or m._backward_pre_hooks  # noqa: SLF001
                or getattr(m, "_compiled_call_impl", None) is not None
                or type(m).__call__ is not _MODULE_CALL)


def _global_hooks() -> bool:
    forward, forward_pre, backward, backward_pre = _GLOBAL_HOOKS
    return bool(forward or forward_pre or backward or backward_pre)


def run_sequential(net: nn.Sequential, x: Any) -> Any:
    """``net(x)`` for an ``nn.Sequential``: each layer's ``forward`` called directly where
    ``layer(x)`` would call only that (see the module's docstring); else ``layer(x)``.

    >>> net = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    >>> x = torch.ones(2, 3)
    >>> torch.equal(run_sequential(net, x), net(x))
    True
    """
    if _global_hooks() or _own_hooks(net) or _is_tracing():
        return net(x)
    for layer in net:  # what Sequential.forward does, minus __call__ where it adds nothing
        x = layer(x) if _own_hooks(layer) else layer.forward(x)
    return x


def _has_keyword_inputs(policy: TensorDictModule) -> bool:
    """Whether the module reads entries as keyword arguments (``in_keys`` given as a dict) or
    takes extra ones: tensordict keeps both private, the direct call handles neither."""
    return bool(policy._get_kwargs) or policy._kwargs is not None  # noqa: SLF001


class DirectCall:
    """What ``policy(td)`` does for a plain ``TensorDictModule``, minus its overhead."""

    def __init__(self, policy: TensorDictModule) -> None:
        self.policy = policy
        self.net: nn.Module = policy.module
        #: The network when it is exactly nn.Sequential (run layer by layer), else None.
        self._sequential = self.net if type(self.net) is nn.Sequential else None
        self.in_keys = list(policy.in_keys)
        self.out_keys = list(policy.out_keys)
        # The common case, one input and one output: no list or tuple per call.
        self._single = (self.in_keys[0], self.out_keys[0]) if (
            len(self.in_keys) == 1 and len(self.out_keys) == 1
            and self.out_keys[0] != "_") else None

    @property
    def bypassed(self) -> bool:
        """Whether this call must take the module's own path (hooks, ``skip_existing``)."""
        return _hooked(self.policy) or skip_existing()

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        if self.bypassed:
            return self.policy(td)
        single = self._single
        if single is not None:
            x, seq = td.get(single[0], None), self._sequential
            out = self.net(x) if seq is None else run_sequential(seq, x)
            if isinstance(out, torch.Tensor):
                td.set(single[1], out)
                return td
        else:
            out = self.net(*[td.get(key, None) for key in self.in_keys])
        for key, value in zip(self.out_keys, self.outputs(out), strict=True):
            if key != "_":
                td.set(key, value)
        return td

    def outputs(self, out: Any) -> tuple[Any, ...]:
        """What the network returned, as one value per out key (TensorDictModule's rules)."""
        out_keys = self.out_keys
        values: tuple[Any, ...]
        if isinstance(out, (dict, TensorDictBase)) and all(k in out for k in out_keys):
            values = tuple(out[k] for k in out_keys)
        else:
            values = out if isinstance(out, tuple) else (out,)
        if len(values) != len(out_keys):
            raise RuntimeError(f"{type(self.net).__name__} returned {len(values)} tensors for "
                               f"the out_keys {out_keys} of its TensorDictModule")
        return values


def direct_call(policy: Any) -> DirectCall | None:
    """A :class:`DirectCall` for ``policy`` when that is all it does; else None.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tensordict.nn import TensorDictModule
    >>> module = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"],
    ...                           out_keys=["action"])
    >>> call = direct_call(module)
    >>> call(TensorDict({"observation": torch.ones(2, 3)}, [2]))["action"].shape
    torch.Size([2, 1])
    """
    if type(policy) is not TensorDictModule:
        return None
    if (policy.inplace is not True or policy.method is not None or policy.method_kwargs
            or _has_keyword_inputs(policy)
            or list(policy.out_keys_source) != list(policy.out_keys)):
        return None
    if not isinstance(policy.module, nn.Module) or not policy.in_keys or not policy.out_keys:
        return None
    return DirectCall(policy)
