"""TorchRL 0.14's ``Collector(backend=..., num_collectors=..., sync=...)`` dispatcher.

TorchRL's ``Collector`` is a front door: ``backend="direct"`` (the default
without ``num_collectors``) collects in the caller's process, and
``backend="process"`` (the default with ``num_collectors``) builds its
``MultiCollector(sync=...)``, ``sync`` defaulting to False. asyncrl keeps the
same door: ``asyncrl.Collector(..., backend="process", num_collectors=N,
sync=True)`` is a :class:`~asyncrl.MultiSyncCollector` with N workers (with
``sync=False`` or no ``sync``, a :class:`~asyncrl.MultiAsyncCollector`). The
create_env_fn rules are TorchRL's: one factory is used by every worker, a
list gives one per worker and must have ``num_collectors`` entries.
``backend_options`` are more constructor arguments. The other backends (Ray,
RPC, torch.distributed, submitit) are refused naming asyncrl's remote workers.

>>> c = dispatch(("CartPole-v1",), {"frames_per_batch": 8, "start_method": "spawn"},
...              backend="process", num_collectors=2, sync=True, backend_options=None)
>>> type(c).__name__, c.num_workers
('MultiSyncCollector', 2)
>>> dispatch(("CartPole-v1",), {"frames_per_batch": 8}, backend=None, num_collectors=None,
...          sync=None, backend_options=None) is None    # direct: asyncrl.Collector itself
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["BACKENDS", "dispatch"]

#: TorchRL 0.14's backends; asyncrl implements "direct" and "process".
BACKENDS = ("direct", "distributed", "process", "ray", "rpc", "submitit")
_REMOTE = ("distributed", "ray", "rpc", "submitit")
#: Keys backend_options may not hold (TorchRL's reserved selector keys).
_RESERVED = ("backend_options", "num_collectors", "num_workers", "sync")
#: TorchRL's Collector-only arguments: at their default they mean nothing to a
#: MultiCollector and are dropped (as TorchRL's _drop_inapplicable_defaults does).
_DIRECT_ONLY_DEFAULTS = {"return_same_td": False, "track_traj_ids": True, "interruptor": None}


def dispatch(args: tuple[Any, ...], kwargs: dict[str, Any], *, backend: str | None,
             num_collectors: int | None, sync: bool | None,
             backend_options: Mapping[str, Any] | None) -> Any:
    """The worker-process collector TorchRL's arguments ask for, or None for ``"direct"``."""
    if len(args) > 2:
        raise TypeError("Collector accepts at most create_env_fn and policy positionally")
    if num_collectors is not None and (isinstance(num_collectors, bool)
                                       or not isinstance(num_collectors, int)):
        raise TypeError(f"Collector(num_collectors={num_collectors!r}): num_collectors must be "
                        "a positive integer (the number of worker processes)")
    if num_collectors is not None and num_collectors < 1:
        raise ValueError(f"Collector(num_collectors={num_collectors}): num_collectors must be "
                         "a positive integer (the number of worker processes)")
    if backend is None:
        backend = "process" if num_collectors is not None else "direct"
    _check_backend(backend)
    options = dict(backend_options or {})
    _check_options(options, args, kwargs)
    if backend == "direct":
        _check_direct(num_collectors, sync, options)
        return None
    if sync is not None and not isinstance(sync, bool):
        raise TypeError(f"Collector(sync={sync!r}): sync must be True, False or None")
    kwargs = {**kwargs, **options}
    args, kwargs = _env_per_worker(args, kwargs, num_collectors)
    for name, default in _DIRECT_ONLY_DEFAULTS.items():
        if name in kwargs and kwargs[name] == default:
            del kwargs[name]
    from .multi.collector import MultiCollector  # the in-process collector imports this module

    return MultiCollector(*args, sync=bool(sync), **kwargs)


def _check_backend(backend: str) -> None:
    if backend in _REMOTE:
        raise ValueError(
            f"Collector(backend={backend!r}): asyncrl has no {backend} backend; its workers "
            "on other hosts join over ZeroMQ: MultiSyncCollector / MultiAsyncCollector("
            "num_workers=N, listen='tcp://0.0.0.0:PORT', remote_workers=M) and "
            "'asyncrl worker --connect tcp://HOST:PORT' on each host (docs/multihost.md)")
    if backend not in BACKENDS:
        raise ValueError(f"Collector does not support backend={backend!r}; expected one of "
                         f"{sorted(BACKENDS)} (asyncrl implements 'direct' and 'process')")


def _check_options(options: dict[str, Any], args: tuple[Any, ...],
                   kwargs: Mapping[str, Any]) -> None:
    reserved = sorted(set(_RESERVED) & options.keys())
    if reserved:
        raise ValueError(f"backend_options contains reserved selector keys: {reserved}; pass "
                         "them as Collector's own arguments")
    given = set(kwargs) | set(("create_env_fn", "policy")[:len(args)])
    duplicates = sorted(options.keys() & given)
    if duplicates:
        raise ValueError("backend_options duplicate top-level collector arguments: "
                         f"{duplicates}")


def _check_direct(num_collectors: int | None, sync: bool | None,
                  options: Mapping[str, Any]) -> None:
    if num_collectors not in (None, 1):
        raise ValueError(f"Collector(backend='direct', num_collectors={num_collectors}): the "
                         "direct backend is one collector in this process; for worker "
                         "processes pass backend='process' (MultiSyncCollector / "
                         "MultiAsyncCollector(num_workers=N))")
    if sync is not None:
        raise ValueError(f"Collector(sync={sync!r}): sync chooses between worker-process "
                         "collectors, and this one is direct (in this process): pass "
                         "num_collectors=N or backend='process' too, or use "
                         "MultiCollector(num_workers=N, sync=True / False)")
    if options:
        raise ValueError(f"Collector(backend_options={options!r}): backend options are for "
                         "worker-process collectors: pass num_collectors=N or "
                         "backend='process' too (MultiSyncCollector / "
                         "MultiAsyncCollector(num_workers=N, ...))")


def _env_per_worker(args: tuple[Any, ...], kwargs: dict[str, Any],
                    num_collectors: int | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """TorchRL's rule: a list of env factories is one per worker, else one copied N times."""
    if args:
        create_env_fn = args[0]
    elif "create_env_fn" in kwargs:
        create_env_fn = kwargs["create_env_fn"]
    else:
        return args, kwargs  # MultiCollector names the missing argument
    if isinstance(create_env_fn, Sequence) and not isinstance(create_env_fn, str | bytes):
        factories = list(create_env_fn)
        if not factories:
            raise ValueError("create_env_fn must contain at least one environment")
        if num_collectors is not None and num_collectors != len(factories):
            raise ValueError("num_collectors does not match the number of environment "
                             f"constructors: {num_collectors} != {len(factories)}")
    else:
        factories = [create_env_fn] * (num_collectors or 1)
    if args:
        return (factories, *args[1:]), kwargs
    return args, {**kwargs, "create_env_fn": factories}
