"""A remote env worker of central inference: the env-stepping loop over TCP, no shared memory.

``asyncrl env-worker --connect tcp://HOST:PORT --env ID_OR_IMPORT_PATH --envs N``
runs :func:`run_remote_env_worker`: it builds its envs here (the env is a gym id
or an import path resolved on this host: code never travels), sends a ``hello``
with their observation and action layouts, and once welcomed steps exactly as a
local env worker (:class:`~asyncrl._inference.env_stepper.EnvStepper`), except that the
observations travel inline in each ``obs`` message and the policy outputs come
back inline in each ``act`` answer (msgpack header + raw tensor frames, never
pickle). Both ends check every tensor against the layouts agreed at join
(:class:`InlineArrays` here, :class:`~.inline_blocks.InlineBlock` in the collector).

Torch-free, as a local env worker: ``asyncrl env-worker`` imports neither torch nor
tensordict (:mod:`asyncrl._spawn.torch_free`). Tensors arrive as numpy arrays and
its arrays leave as tensors (:mod:`transports._torch_free`); a chunk leaves as a
TensorDict built of its buffers (:class:`transports.ArrayDict`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import numpy as np

from transports import (
    ArrayDict,
    CurveClient,
    ErrorPayload,
    Link,
    PeerLostError,
    ProtocolError,
    random_identity,
)

from .._errors import JoinTimeout, RefusedError
from .._rollout.env_pools import EnvPool
from .._worker.log_forward import LogForwarder
from .env_stepper import (
    ERROR,
    REFUSED,
    EnvStepper,
    EnvWorkerConfig,
    build_pool,
    numpy_dtype,
)

log = logging.getLogger("asyncrl.env_worker")

#: Join messages: a remote env worker's hello, the collector's welcome or refusal.
HELLO, WELCOME = "env-hello", "env-welcome"
#: The join protocol's version (in the hello; a different one is refused).
JOIN_PROTOCOL = 1

#: An inline block's layout: ``key -> (dtype name, shape)``.
Layout = dict[str, tuple[str, tuple[int, ...]]]
#: The dtypes an answer may carry (what a SharedArrayBlock can hold).
DTYPES = frozenset({"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                    "uint64", "float16", "float32", "float64", "complex64", "complex128",
                    "bfloat16"})


def describe(value: Any) -> str:
    """A short, bounded description of what came (for error messages)."""
    if isinstance(value, np.ndarray) or type(value).__module__.startswith("torch"):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, Mapping):
        keys = list(value)[:8]
        return "{" + ", ".join(f"{str(k)[:32]!s}: {describe(value[k])}" for k in keys) + (
            ", ...}" if len(value) > 8 else "}")
    return type(value).__name__


def _as_array(value: Any) -> Any:
    """A tensor (a worker run where torch is, a test's) as the array of its bytes."""
    if isinstance(value, np.ndarray) or not type(value).__module__.startswith("torch"):
        return value
    import torch  # (it is loaded: a tensor came)

    if value.dtype == torch.bfloat16:
        return value.view(torch.int16).numpy().view(np.uint16)
    return value.numpy()


class InlineArrays:
    """The worker's end of an inline block: numpy arrays that travel in messages.

    The collector sends tensors, which a torch-free process decodes as numpy arrays
    (:mod:`transports._torch_free`); the arrays it sends travel as tensors.
    ``write`` / ``read_into`` copy into and out of preallocated arrays (nothing is
    allocated per step); :meth:`fill` first checks what came from the network
    against the layout agreed at join: the same keys, dtypes and shapes, or a
    ValueError naming what was expected and what came.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = dict(layout)
        self.tensors = {k: np.zeros(shape, dtype=numpy_dtype(dtype))
                        for k, (dtype, shape) in layout.items()}
        self.version = 0

    def write(self, arrays: Mapping[str, Any], *, version: int = 0, slot: int = 0) -> None:
        for key, dst in self.tensors.items():
            np.copyto(dst, arrays[key])
        self.version = version

    def read_into(self, dst: Mapping[str, Any], slot: int = 0) -> int:
        for key, out in dst.items():
            np.copyto(out, self.tensors[key])
        return self.version

    def fill(self, body: Any, what: str, version: int = 0) -> None:
        """Check ``body`` (``{key: array}``) against the layout, then copy it in."""
        expected = {k: f"{d}{list(s)}" for k, (d, s) in self.layout.items()}
        arrays = {k: _as_array(v) for k, v in body.items()} if isinstance(body, Mapping) else None
        ok = arrays is not None and set(arrays) == set(self.layout) and all(
            isinstance(arrays[k], np.ndarray) and arrays[k].dtype == self.tensors[k].dtype
            and tuple(arrays[k].shape) == s for k, (_, s) in self.layout.items())
        if not ok:
            raise ValueError(f"{what}: expected {expected}, got {describe(body)}")
        self.write(arrays, version=version)  # type: ignore[arg-type]

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass


def pool_layout(pool: EnvPool) -> dict[str, Any]:
    """What a hello says about this host's envs: count, observations, action (per env)."""
    spec = pool.specs.action
    return {"protocol": JOIN_PROTOCOL, "envs": pool.num_envs,
            "obs": [[a.dtype.name, list(a.shape[1:])] for a in pool.obs_arrays],
            "action": [np.dtype(spec.dtype).name, list(spec.shape)]}


class RemoteStepper(EnvStepper):
    """An :class:`EnvStepper` whose observations and actions travel in the messages."""

    _chunk: ArrayDict | None = None

    def chunk_body(self) -> Any:
        """The chunk ``[E, C]``, sent as a TensorDict of its buffers (encoded at once)."""
        if self._chunk is None:
            rows, steps = next(iter(self._data.values())).shape[:2]
            entries: dict[str, Any] = {}
            for path, array in self._data.items():
                node = entries
                for key in path[:-1]:
                    node = node.setdefault(key, {})
                node[path[-1]] = array
            self._chunk = ArrayDict([rows, steps], entries)
        return self._chunk

    def request_body(self) -> Any:
        return self.obs_block.tensors

    def read_answer(self, body: Any, read: Callable[[Any, int], int]) -> int:
        version = body.get("v") if isinstance(body, Mapping) else None
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ProtocolError(f"an 'act' answer needs a policy version 'v', got {describe(body)}")
        self.act_block.fill(body.get("a"), "the collector's answer", version)
        return read(self.act_dst, 0)


def welcome_config(body: Any, pool: EnvPool, *, heartbeat_interval: float,
                   peer_timeout: float) -> tuple[EnvWorkerConfig, InlineArrays, InlineArrays]:
    """The stepper's config and its two inline blocks, from the collector's welcome."""
    try:
        slot, steps = int(body["slot"]), int(body["chunk_steps"])
        tag = int(body.get("traj_tag", slot))  # (a collector before slot reuse sent none)
        obs_paths = [tuple(str(k) for k in p) for p in body["obs_paths"]]
        extra_paths = [tuple(str(k) for k in p) for p in body["extra_paths"]]
        act = {str(k): (_dtype(d), tuple(int(x) for x in s)) for k, (d, s) in
               body["act"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed welcome from the collector: {exc!r}") from None
    if not 0 < steps <= 1 << 16 or not 0 <= slot < 1 << 20 or not 0 <= tag < 1 << 31:
        raise ProtocolError(f"welcome: slot {slot} / traj_tag {tag} / chunk_steps {steps} "
                            "out of range")
    obs = {f"o{i}": (a.dtype.name, tuple(a.shape)) for i, a in enumerate(pool.obs_arrays)}
    config = EnvWorkerConfig(slot=slot, factories=[], create_env_kwargs={}, obs_block="",
                             act_block="", obs_paths=obs_paths, extra_paths=extra_paths,
                             chunk_steps=steps, heartbeat_interval=heartbeat_interval,
                             peer_timeout=peer_timeout, traj_tag=tag)
    return config, InlineArrays(obs), InlineArrays(act)


def _dtype(name: Any) -> str:
    if not (isinstance(name, str) and name in DTYPES):
        raise ValueError(f"not a dtype an env worker holds: {str(name)[:40]!r}")
    return name


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


__all__ = ["DTYPES", "HELLO", "JOIN_PROTOCOL", "REFUSED", "WELCOME", "InlineArrays",
           "JoinTimeout", "RemoteStepper", "describe", "pool_layout", "run_remote_env_worker"]
