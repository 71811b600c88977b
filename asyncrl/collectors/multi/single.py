"""TorchRL 0.14's ``AsyncCollector``: one collector in one worker process, off-policy.

TorchRL defines it as "a MultiAsyncCollector where a single process is being
created": the env factory is one callable (not a list), collection runs ahead
of the trainer in that process, and each batch carries the policy version that
produced it. asyncrl's is exactly that, on :class:`MultiAsyncCollector`.
"""

from __future__ import annotations

from typing import Any

from .._docs import init_signature, share_parameters
from .collector import MultiAsyncCollector, MultiCollector

__all__ = ["AsyncCollector"]


class AsyncCollector(MultiAsyncCollector):
    """One worker process collecting ahead of the trainer: TorchRL 0.14's ``AsyncCollector``.

    ``AsyncCollector(create_env_fn, policy, ...)`` is ``MultiAsyncCollector(
    [create_env_fn], policy, ...)``: the same arguments with one env factory
    (or gymnasium id) and one worker; batches are ``[time]`` (``[envs, time]``
    with ``envs_per_worker``), collected at most ``prefetch`` batches ahead,
    each frame stamped with ``("collector", "policy_version")``;
    ``frames_per_batch`` frames per batch, all from its one worker. TorchRL's
    off-policy scripts (``sac-async.py``) use it to overlap collection and
    training.

    >>> async with AsyncCollector("Pendulum-v1", policy, frames_per_batch=200,  # doctest: +SKIP
    ...                           total_frames=10_000) as collector:
    ...     async for batch in collector:
    ...         replay_buffer.extend(batch)
    ...         collector.update_policy_weights_()   # starts at once, awaited or not
    """

    def __init__(self, create_env_fn: Any, policy: Any = None, **kwargs: Any) -> None:
        if "num_workers" in kwargs and kwargs["num_workers"] not in (None, 1):
            raise TypeError(f"AsyncCollector(num_workers={kwargs['num_workers']!r}): "
                            "AsyncCollector runs one worker process (TorchRL's meaning); for "
                            "several use MultiAsyncCollector(num_workers=N)")
        kwargs.pop("num_workers", None)
        if isinstance(create_env_fn, list | tuple):
            raise TypeError("AsyncCollector(create_env_fn=[...]): AsyncCollector takes one env "
                            "factory (TorchRL's meaning); for one worker per factory use "
                            "MultiAsyncCollector([make_env, ...])")
        super().__init__([create_env_fn], policy, **kwargs)  # create_env_kwargs: a dict


# help(): MultiCollector's parameters, less the two AsyncCollector fixes (one worker, async).
_BASE = init_signature(MultiCollector)
AsyncCollector.__signature__ = _BASE.replace(
    parameters=[p for p in _BASE.parameters.values() if p.name not in ("num_workers", "sync")])
share_parameters(AsyncCollector, MultiAsyncCollector)
