"""A remote env worker of central inference: the env-stepping loop over TCP, no shared memory.

``asyncrl env-worker --connect tcp://HOST:PORT --env ID_OR_IMPORT_PATH --envs N``
runs :func:`run_remote_env_worker`: it builds its envs here (the env is a gym id
or an import path resolved on this host: code never travels), sends a ``hello``
with their observation and action layouts, and once welcomed steps exactly as a
local env worker (:class:`~asyncrl._inference.env_stepper.EnvStepper`), except that the
observations travel inline in each ``obs`` message and the policy outputs come
back inline in each ``act`` answer (msgpack header + raw tensor frames, never
pickle). Both ends check every tensor against the layouts agreed at join
(:class:`InlineBlock`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from transports import (
    CurveClient,
    ErrorPayload,
    Link,
    PeerLostError,
    ProtocolError,
    random_identity,
)

from .._errors import JoinTimeout, RefusedError
from .._rollout.env_pools import EnvPool
from .._rollout.policies import torch_dtype
from .._worker.log_forward import LogForwarder
from .env_stepper import (
    ERROR,
    REFUSED,
    EnvStepper,
    EnvWorkerConfig,
    build_pool,
)
from .env_stepper import dtype_name as _name

log = logging.getLogger("asyncrl.env_worker")

#: Join messages: a remote env worker's hello, the collector's welcome or refusal.
HELLO, WELCOME = "env-hello", "env-welcome"
#: The join protocol's version (in the hello; a different one is refused).
JOIN_PROTOCOL = 1

Layout = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def describe(value: Any) -> str:
    """A short, bounded description of what came (for error messages)."""
    if isinstance(value, torch.Tensor):
        return f"{dtype_name(value.dtype)}{list(value.shape)}"
    if isinstance(value, Mapping):
        keys = list(value)[:8]
        return "{" + ", ".join(f"{str(k)[:32]!s}: {describe(value[k])}" for k in keys) + (
            ", ...}" if len(value) > 8 else "}")
    return type(value).__name__


class InlineBlock:
    """A shared-memory block's interface over tensors that travel in messages.

    ``write`` copies into preallocated tensors (the loop allocates nothing per
    step); :meth:`fill` first checks what came from the network against the
    layout agreed at join: the same keys, dtypes and shapes, or a ValueError
    naming what was expected and what came.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = dict(layout)
        self.tensors = {k: torch.zeros(shape, dtype=dtype) for k, (dtype, shape) in layout.items()}
        self.version = 0

    def write(self, tensors: Mapping[str, Any], *, version: int = 0, slot: int = 0) -> None:
        """Copy ``tensors`` in (tensors, or an env worker's numpy arrays)."""
        for key, dst in self.tensors.items():
            src = tensors[key]
            dst.copy_(src if isinstance(src, torch.Tensor) else torch.from_numpy(src))
        self.version = version

    def read_into(self, dst: Mapping[str, Any], slot: int = 0) -> int:
        """Copy out into ``dst`` (tensors, or an env worker's numpy arrays: a dtype numpy
        lacks, bfloat16, lands as its bytes, :func:`~.env_stepper.numpy_dtype`)."""
        for key, out in dst.items():
            src = self.tensors[key]
            if isinstance(out, np.ndarray):
                np.copyto(out, _bytes_view(src) if out.dtype != _numpy_of(src) else src.numpy())
            else:
                out.copy_(src)
        return self.version

    def fill(self, body: Any, what: str, version: int = 0) -> None:
        """Check ``body`` (``{key: tensor}``) against the layout, then copy it in."""
        expected = {k: f"{dtype_name(d)}{list(s)}" for k, (d, s) in self.layout.items()}
        ok = isinstance(body, Mapping) and set(body) == set(self.layout) and all(
            isinstance(body[k], torch.Tensor) and body[k].dtype == d and tuple(body[k].shape) == s
            for k, (d, s) in self.layout.items())
        if not ok:
            raise ValueError(f"{what}: expected {expected}, got {describe(body)}")
        self.write(body, version=version)

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass


def pool_layout(pool: EnvPool) -> dict[str, Any]:
    """What a hello says about this host's envs: count, observations, action (per env)."""
    spec = pool.specs.action
    return {"protocol": JOIN_PROTOCOL, "envs": pool.num_envs,
            "obs": [[dtype_name(torch_dtype(a.dtype.name)), list(a.shape[1:])]
                    for a in pool.obs_arrays],
            "action": [dtype_name(torch_dtype(spec.dtype)), list(spec.shape)]}


def _numpy_of(tensor: torch.Tensor) -> Any:
    try:
        return torch.empty(0, dtype=tensor.dtype).numpy().dtype
    except TypeError:  # numpy lacks it
        return None


def _bytes_view(tensor: torch.Tensor) -> np.ndarray:
    """A 2-byte float's bits as uint16 (how an env worker holds bfloat16)."""
    return tensor.view(torch.int16).numpy().view(np.uint16)


class RemoteStepper(EnvStepper):
    """An :class:`EnvStepper` whose observations and actions travel in the messages."""

    _chunk: TensorDictBase | None = None

    def chunk_body(self) -> Any:
        """The chunk as a TensorDict ``[E, C]`` over the buffers (cloned per message)."""
        if self._chunk is None:
            rows, steps = next(iter(self._data.values())).shape[:2]
            chunk = TensorDict({}, batch_size=[rows, steps])
            for path, array in self._data.items():
                tensor = torch.from_numpy(array)
                if _name(self.layout[path][0]) == "bfloat16":
                    tensor = tensor.view(torch.bfloat16)  # its bytes, held as uint16
                chunk.set(path[0] if len(path) == 1 else path, tensor)
            self._chunk = chunk
        return self._chunk.clone()

    def request_body(self) -> Any:
        return self.obs_block.tensors  # type: ignore[attr-defined]

    def read_answer(self, body: Any, read: Callable[[Any, int], int]) -> int:
        version = body.get("v") if isinstance(body, Mapping) else None
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ProtocolError(f"an 'act' answer needs a policy version 'v', got {describe(body)}")
        self.act_block.fill(body.get("a"), "the collector's answer", version)  # type: ignore[attr-defined]
        return read(self.act_dst, 0)


def welcome_config(body: Any, pool: EnvPool, *, heartbeat_interval: float,
                   peer_timeout: float) -> tuple[EnvWorkerConfig, InlineBlock, InlineBlock]:
    """The stepper's config and its two inline blocks, from the collector's welcome."""
    try:
        slot, steps = int(body["slot"]), int(body["chunk_steps"])
        tag = int(body.get("traj_tag", slot))  # (a collector before slot reuse sent none)
        obs_paths = [tuple(str(k) for k in p) for p in body["obs_paths"]]
        extra_paths = [tuple(str(k) for k in p) for p in body["extra_paths"]]
        act = {str(k): (parse_dtype(d), tuple(int(x) for x in s)) for k, (d, s) in
               body["act"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed welcome from the collector: {exc!r}") from None
    if not 0 < steps <= 1 << 16 or not 0 <= slot < 1 << 20 or not 0 <= tag < 1 << 31:
        raise ProtocolError(f"welcome: slot {slot} / traj_tag {tag} / chunk_steps {steps} "
                            "out of range")
    obs = {f"o{i}": (torch_dtype(a.dtype.name), tuple(a.shape))
           for i, a in enumerate(pool.obs_arrays)}
    config = EnvWorkerConfig(slot=slot, factories=[], create_env_kwargs={}, obs_block="",
                             act_block="", obs_paths=obs_paths, extra_paths=extra_paths,
                             chunk_steps=steps, heartbeat_interval=heartbeat_interval,
                             peer_timeout=peer_timeout, traj_tag=tag)
    return config, InlineBlock(obs), InlineBlock(act)


async def run_remote_env_worker(connect: str, env: Any, *, envs: int = 1,
                                create_env_kwargs: Mapping[str, Any] | None = None,
                                peer_timeout: float = 10.0,
                                join_timeout: float = 60.0,
                                curve_keys: str | None = None,
                                on_admission: Callable[[bool], None] | None = None,
                                log_forwarder: LogForwarder | None = None) -> int:
    """Join the collector at ``connect``, step ``envs`` envs until it says close.

    0 when the collector closed (or went away), 1 on an error (reported to the
    collector when it can still hear us); a refusal raises :class:`RefusedError`.
    ``on_admission`` is told True once welcomed and False when that ends (the
    readiness probe of ``asyncrl env-worker --probe-port``). ``log_forwarder``'s
    records go to the collector's ``asyncrl.worker`` logger once welcomed.
    """
    interval = min(1.0, peer_timeout / 4)
    curve = CurveClient.load(curve_keys)  # None: ASYNCRL_CURVE_* variables, if set
    pool = await anyio.to_thread.run_sync(build_pool, [env] * envs, dict(create_env_kwargs or {}))
    stepper: EnvStepper | None = None
    identity = random_identity(f"{socket.gethostname()}-{os.getpid()}-env")
    try:
        async with Link(connect, identity=identity, heartbeat_interval=interval,
                        peer_timeout=peer_timeout, curve=curve) as link:
            # Who we are, for the collector's statistics() and events() (not a credential).
            await link.send({**pool_layout(pool), "host": socket.gethostname()[:255],
                             "pid": os.getpid()}, kind=HELLO)
            message = None
            with anyio.move_on_after(join_timeout):
                message = await link.recv()
            if message is None:
                raise JoinTimeout(
                    f"no welcome from {connect} within --join-timeout {join_timeout} s: "
                    "something accepts connections there but does not answer as an "
                    "AsyncBatchedCollector (a different service on that port, or a trainer "
                    "whose event loop is blocked)")
            if message.kind == REFUSED:
                raise RefusedError(f"the collector at {connect} refused this env worker: "
                                   f"{str(message.body)[:2000]}")
            if message.kind != WELCOME:
                raise ProtocolError(f"expected {WELCOME!r} or {REFUSED!r}, got {message.kind!r}")
            config, obs, act = welcome_config(message.body, pool, heartbeat_interval=interval,
                                              peer_timeout=peer_timeout)
            stepper = RemoteStepper(config, pool=pool, blocks=(obs, act))
            if on_admission is not None:
                on_admission(True)
            try:
                await _step_forwarding_logs(stepper, link, log_forwarder)
                return 0
            except PeerLostError:
                return 0
            except RefusedError:
                raise
            except Exception as exc:
                with anyio.move_on_after(2):
                    await link.send(ErrorPayload.from_exception(exc).to_body(), kind=ERROR)
                raise
    finally:
        if on_admission is not None:
            on_admission(False)
        if stepper is not None:
            stepper.close()
        else:
            pool.close()


async def _step_forwarding_logs(stepper: RemoteStepper, link: Link,
                                forwarder: LogForwarder | None) -> None:
    """``stepper.run(link)``, with this process's log records sent over ``link`` meanwhile."""
    if forwarder is None:
        await stepper.run(link)
        return
    failure: Exception | None = None

    async def forward() -> None:
        try:
            await forwarder.forward(link, lambda: True)
        except Exception:  # the link went down: the stepper says why; stderr gets the rest
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(forward)
        try:
            await stepper.run(link)
        except Exception as exc:  # raised as itself below, not in a task group's group
            failure = exc
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure


__all__ = ["HELLO", "JOIN_PROTOCOL", "REFUSED", "WELCOME", "InlineBlock", "JoinTimeout",
           "RemoteStepper", "parse_dtype", "pool_layout", "run_remote_env_worker"]
