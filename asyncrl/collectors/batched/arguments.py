"""AsyncBatchedCollector's TorchRL-style arguments, checked once; TorchRL-only ones refused.

They sit with the collector, on the collectors' floor (they speak TorchRL's names and
use its checks); what they configure lives in :mod:`asyncrl._inference`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..._inference.doorbell import usable_cores
from ..._inference.policy_server import PolicyServer
from ..._inference.process_server import ProcessPolicyServer
from ..._inference.remote_env_hosts import check_listen
from ..._inference.thread_server import ThreadPolicyServer
from ..._inference.worker_blocks import MAX_SPLITS
from .._config import check_int

#: TorchRL arguments of ``AsyncBatchedCollector`` that asyncrl does not take, and what to use.
_REFUSED: dict[str, str] = {
    "transport": "asyncrl's transport is fixed: shared-memory slots for observations and "
                 "actions, eventfd doorbells for signalling (ZeroMQ for remote env "
                 "hosts); leave it out",
    "device_config": "pass device= (where the policy runs); batches are stored on the CPU",
    "weight_sync": "call 'await collector.update_policy_weights(weights)': it returns once "
                   "the inference loop uses them",
    "worker_affinity": "pin the env workers with taskset/numactl on the trainer's command line",
    "driver_affinity": "pin the trainer with taskset/numactl",
    "reset_at_each_iter": "central inference has no per-batch boundary in the env workers; "
                          "use MultiSyncCollector(reset_at_each_iter=True)",
    "policy_version_key": "versions are always stamped at ('collector', 'policy_version')",
}
#: TorchRL arguments accepted only with the value that says what asyncrl does anyway.
_ONLY: dict[str, tuple[tuple[Any, ...], str]] = {
    "backend": ((None, "multiprocessing"),
                "env workers are processes and the policy is served from a thread of the "
                "trainer's process (server_backend='process': a dedicated process); use "
                "MultiCollector for other layouts"),
    "env_backend": ((None, "multiprocessing"), "env workers are always processes"),
    "policy_backend": ((None, "threading"),
                       "it picks TorchRL's transport to the inference server; asyncrl's is "
                       "always shared memory plus eventfd doorbells. For a dedicated "
                       "inference process pass server_backend='process'; for one policy "
                       "copy per env worker use MultiCollector"),
    "env_exchange": (("auto", "shm"), "local observations always travel in shared memory "
                     "(remote env workers, with listen= and remote_workers=, send them "
                     "inline)"),
    "weight_sync_model_id": (("policy",), "central inference serves one model, 'policy'"),
}


def refuse_torchrl_only(options: dict[str, Any]) -> None:
    """Raise for any TorchRL argument asyncrl does not support, naming the asyncrl way."""
    for name, value in options.items():
        if name in _REFUSED:
            raise TypeError(f"AsyncBatchedCollector: {name}= is TorchRL's and not supported "
                            f"here: {_REFUSED[name]}")
        if name in _ONLY:
            allowed, why = _ONLY[name]
            if value not in allowed:
                raise ValueError(f"AsyncBatchedCollector: {name}={value!r} is not supported "
                                 f"(accepted: {allowed}): {why}")
            continue
        raise TypeError(f"AsyncBatchedCollector() got an unexpected keyword argument {name!r}")


#: Where the policy is served: a thread of the trainer's process, or a dedicated process.
SERVER_BACKENDS = ("thread", "process")
_SERVER_TYPES: dict[str, type[PolicyServer]] = {"thread": ThreadPolicyServer,
                                                "process": ProcessPolicyServer}
#: TorchRL's ``InferenceServerConfig`` fields and their defaults (those asyncrl has no use for).
_SERVER_CONFIG_DEFAULTS = {"collect_stats": True, "stats_window_size": 1024,
                           "max_inflight_per_env": None}


def check_server_backend(server_backend: Any) -> str:
    """``"thread"`` or ``"process"`` (both serve local and remote env workers)."""
    if server_backend not in SERVER_BACKENDS:
        raise ValueError(f"server_backend must be one of {SERVER_BACKENDS}, got "
                         f"{server_backend!r}")
    return str(server_backend)


def policy_server_type(server_backend: str) -> type[PolicyServer]:
    """The :class:`~asyncrl._inference.policy_server.PolicyServer` of a checked backend."""
    return _SERVER_TYPES[server_backend]


def from_server_config(config: Any, *, server_backend: str, max_batch_size: Any,
                       min_batch_size: Any, server_timeout: Any,
                       static_batch_size: Any = None) -> tuple[str, Any, Any, Any, Any]:
    """TorchRL's ``server_config=InferenceServerConfig(...)`` as asyncrl's arguments.

    Returns ``(server_backend, max_batch_size, min_batch_size, server_timeout,
    static_batch_size)``. As in TorchRL it excludes the three batching keywords
    (and asyncrl's ``static_batch_size=``); fields asyncrl has no equivalent for
    are refused unless left at their defaults.
    """
    fields = ("service_backend", "max_batch_size", "min_batch_size", "timeout")
    if not all(hasattr(config, f) for f in fields):
        raise TypeError(f"server_config must be TorchRL's InferenceServerConfig, got "
                        f"{type(config).__name__}; or pass max_batch_size=, min_batch_size=, "
                        "server_timeout= and server_backend= directly")
    if any(v is not None for v in (max_batch_size, min_batch_size, server_timeout,
                                   static_batch_size)):
        raise ValueError("server_config is mutually exclusive with the max_batch_size, "
                         "min_batch_size, server_timeout (as in TorchRL) and "
                         "static_batch_size keyword arguments")
    if server_backend != "thread":
        raise ValueError("give the server backend once: server_config's service_backend or "
                         "server_backend=, not both")
    for name, default in _SERVER_CONFIG_DEFAULTS.items():
        value = getattr(config, name, default)
        if value != default:
            raise ValueError(f"server_config.{name}={value!r} is not supported: asyncrl "
                             "batches whatever is ready, up to max_batch_size, and counts "
                             "every call (inference_statistics()); leave it at "
                             f"{default!r}")
    return (config.service_backend, config.max_batch_size, config.min_batch_size,
            config.timeout, getattr(config, "static_batch_size", None))


def env_factories(create_env_fn: Any, num_envs: Any, *, remote_workers: int = 0) -> list[Any]:
    """One factory per local env: a list as given, or one factory / gym id times ``num_envs``.

    ``num_envs=0`` (no local env: remote env hosts only) needs ``remote_workers``; the
    one factory given is still built once on the trainer, for the env's layouts.
    """
    if num_envs == 0 and not isinstance(num_envs, bool):
        if not remote_workers:
            raise ValueError("num_envs=0 runs no local env: give remote_workers=K (and "
                             "listen=) for remote env hosts, or num_envs >= 1")
        if isinstance(create_env_fn, (list, tuple)):
            raise ValueError("num_envs=0 (remote env hosts only) takes one env factory or gym "
                             "id, built once here for the env's layouts, not a list")
        if not (isinstance(create_env_fn, str) or callable(create_env_fn)):
            raise TypeError(f"create_env_fn must be a gym id, an import path or a callable; "
                            f"got {type(create_env_fn).__name__}")
        return []
    if isinstance(create_env_fn, (list, tuple)):
        if not create_env_fn:
            raise ValueError("create_env_fn is an empty list: give one env factory per env")
        if num_envs is not None and num_envs != len(create_env_fn):
            raise ValueError(f"num_envs={num_envs} but create_env_fn lists "
                             f"{len(create_env_fn)} factories: leave num_envs out")
        factories = list(create_env_fn)
    else:
        if num_envs is None:
            raise ValueError("one env factory (or gym id) needs num_envs=N, the number of envs "
                             "to run; or pass a list of factories, one per env (TorchRL's way)")
        factories = [create_env_fn] * check_int("num_envs", num_envs, minimum=1)
    for f in factories:
        if not (isinstance(f, str) or callable(f)):
            raise TypeError(f"create_env_fn entries must be gym ids, import paths or "
                            f"callables; got {type(f).__name__}")
    return factories


def check_serving_device(device: Any, static_batch_size: int | None) -> torch.device | None:
    """:func:`check_device`; a CUDA one when the policy is captured in a CUDA graph."""
    dev = check_device(device)
    if static_batch_size is not None and (dev is None or dev.type != "cuda"):
        raise ValueError(f"static_batch_size={static_batch_size} captures the served policy "
                         "in a CUDA graph: it needs device='cuda' (the policy's device), got "
                         f"device={device!r}; leave static_batch_size out to serve it eagerly")
    return dev


def check_env_kwargs(create_env_kwargs: Any) -> dict[str, Any]:
    """One dict of keyword arguments for every env."""
    if isinstance(create_env_kwargs, (list, tuple)):
        raise TypeError("create_env_kwargs: one dict for every env (a list is not "
                        "supported: put the differences in the factories)")
    return dict(create_env_kwargs or {})


def check_remote(listen: str | None, remote_workers: int, curve_keys: str | None) -> None:
    """``listen`` for ``remote_workers`` (:func:`check_listen`); ``curve_keys`` needs it."""
    check_listen(listen, remote_workers)
    if curve_keys is not None and listen is None:
        raise ValueError("curve_keys encrypts the listen= endpoint: give listen too")


def check_device(device: Any) -> torch.device | None:
    """A device this machine has, or a clear error (never a silent fallback to the CPU)."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: this machine has no CUDA device; use 'cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} "
                         "CUDA device(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}: MPS is not available here; use 'cpu'")
    return dev


@dataclass(frozen=True)
class BatchingConfig:
    """The inference server's batching: in observations (env rows) per policy call."""

    max_batch_size: int
    min_batch_size: int
    server_timeout: float
    envs_per_worker: int
    chunk_steps: int | None  # None: automatic
    #: Equal splits of each local env worker's envs, each asking on its own (Sample
    #: Factory's ``worker_num_splits``): one steps while the policy serves another.
    splits: int = 1
    #: Rows of the CUDA graph the policy is captured in (TorchRL's ``static_batch_size``);
    #: None: eager calls.
    static_batch_size: int | None = None

    @classmethod
    def check(cls, *, num_envs: int, max_batch_size: Any, min_batch_size: Any,
              server_timeout: Any, envs_per_worker: Any,
              transition_chunk_size: Any, worker_num_splits: Any = 1,
              static_batch_size: Any = None) -> BatchingConfig:
        if envs_per_worker is None:  # the layout for this machine (auto_layout)
            if worker_num_splits not in (None, 1):
                raise ValueError(f"worker_num_splits={worker_num_splits} splits the envs of "
                                 "each env worker: give envs_per_worker with it (left out, "
                                 "both are chosen for this machine's cores)")
            envs_per_worker, worker_num_splits = auto_layout(num_envs, usable_cores())
        elif worker_num_splits is None:
            worker_num_splits = 1
        epw = check_int("envs_per_worker", envs_per_worker, minimum=1)
        epw = min(epw, num_envs) if num_envs else 1  # 0: remote env hosts only
        splits = check_splits(worker_num_splits, num_envs=num_envs, envs_per_worker=epw)
        static = None if static_batch_size is None else check_int(
            "static_batch_size", static_batch_size, minimum=1)
        # Left out, max_batch_size is 64, or the graph's rows when there is a graph.
        max_bs = (64 if static is None else static) if max_batch_size is None else check_int(
            "max_batch_size", max_batch_size, minimum=1)
        if max_bs < epw // splits and splits == 1:
            raise ValueError(f"max_batch_size={max_bs} is smaller than envs_per_worker={epw}: "
                             "one worker's request (all its envs) is served in one call; raise "
                             "max_batch_size, lower envs_per_worker or split the workers' envs "
                             "(worker_num_splits)")
        if max_bs < epw // splits:
            raise ValueError(f"max_batch_size={max_bs} is smaller than one request of "
                             f"{epw // splits} envs (envs_per_worker={epw}, worker_num_splits="
                             f"{splits}): a request is served in one call; raise "
                             "max_batch_size or worker_num_splits")
        min_bs = 1 if min_batch_size is None else check_int("min_batch_size", min_batch_size,
                                                            minimum=1)
        if min_bs > max_bs:
            raise ValueError(f"min_batch_size={min_bs} > max_batch_size={max_bs}")
        if num_envs and min_bs > num_envs:  # (remote env hosts bring envs of their own)
            raise ValueError(f"min_batch_size={min_bs} can never be met by {num_envs} envs: "
                             "use at most the number of envs")
        timeout = 0.01 if server_timeout is None else server_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout < 0:
            raise ValueError(f"server_timeout must be a number of seconds >= 0, got {timeout!r}")
        chunk: int | None = None
        if transition_chunk_size != "auto":
            chunk = check_int("transition_chunk_size", transition_chunk_size, minimum=1)
        if static is not None and static < max_bs:
            raise ValueError(f"static_batch_size={static} is smaller than max_batch_size="
                             f"{max_bs}: every call is padded to static_batch_size rows, "
                             "so it must be at least max_batch_size (as in TorchRL)")
        return cls(max_bs, min_bs, float(timeout), epw, chunk, splits, static)


def auto_layout(num_envs: int, cores: int) -> tuple[int, int]:
    """``(envs_per_worker, worker_num_splits)`` for ``num_envs`` local envs on ``cores``.

    One env worker per core at most, each stepping its envs in two splits when it has
    an even number (one split steps while the policy serves the other); one env per
    worker while the cores suffice. Measured on real Atari, 8 envs on 2 cores
    (docs/benchmarks.md, "Pixels: real Atari"): 2 workers of 4 envs in 2 splits gave 11 %
    more frames/s than 8 single-env workers on a quiet machine and 14 % more beside two
    busy processes, with less CPU per frame (a wakeup per frame fewer) and memory. The
    collector's default stays one env per worker, TorchRL's layout, the same on every
    machine.

    >>> auto_layout(8, cores=2), auto_layout(8, cores=16), auto_layout(6, cores=4)
    ((4, 2), (1, 1), (2, 2))
    >>> auto_layout(7, cores=2), auto_layout(0, cores=2)
    ((4, 1), (1, 1))
    """
    if num_envs <= cores:
        return 1, 1
    per_worker = -(-num_envs // cores)
    last = num_envs % per_worker
    splits = 2 if per_worker % 2 == 0 and last % 2 == 0 else 1
    return per_worker, splits


def check_splits(worker_num_splits: Any, *, num_envs: int, envs_per_worker: int) -> int:
    """``worker_num_splits``: it must split every local env worker's envs equally."""
    splits = check_int("worker_num_splits", worker_num_splits, minimum=1)
    if splits == 1:
        return 1
    if not num_envs:
        raise ValueError(f"worker_num_splits={splits} splits the envs of local env workers, "
                         "and num_envs=0 starts none: a remote env host steps its envs in one "
                         "request; leave worker_num_splits=1")
    if splits > MAX_SPLITS:
        raise ValueError(f"worker_num_splits={splits}: at most {MAX_SPLITS}")
    last = num_envs % envs_per_worker
    if envs_per_worker % splits or last % splits:
        odd = (f"envs_per_worker={envs_per_worker}" if envs_per_worker % splits
               else f"the last worker's {last} envs (num_envs={num_envs})")
        raise ValueError(f"worker_num_splits={splits} steps each env worker's envs in "
                         f"{splits} equal splits, and {odd} do not split so: give "
                         f"envs_per_worker and num_envs multiples of {splits}")
    return splits


def split_envs(factories: Sequence[Any], envs_per_worker: int) -> list[list[Any]]:
    """Consecutive groups of ``envs_per_worker`` factories (the last one may be smaller)."""
    return [list(factories[i:i + envs_per_worker])
            for i in range(0, len(factories), envs_per_worker)]


def check_policy(policy: Any, policy_factory: Callable[[], Any] | None) -> None:
    if policy is not None and policy_factory is not None:
        raise TypeError("policy and policy_factory are mutually exclusive: give one")
    if policy_factory is not None and not callable(policy_factory):
        raise TypeError(f"policy_factory must be a callable returning the policy, got "
                        f"{type(policy_factory).__name__}")
    if policy is not None and not callable(policy):
        raise TypeError(f"policy must be callable, got {type(policy).__name__}")


__all__ = [
    "SERVER_BACKENDS",
    "BatchingConfig",
    "auto_layout",
    "check_device",
    "check_env_kwargs",
    "check_policy",
    "check_remote",
    "check_server_backend",
    "check_serving_device",
    "check_splits",
    "env_factories",
    "from_server_config",
    "policy_server_type",
    "refuse_torchrl_only",
    "split_envs",
]
