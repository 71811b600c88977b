"""A remote env worker of central inference: the env-stepping loop over TCP, no shared memory.

``asyncrl worker --role env --connect tcp://HOST:PORT --env ID_OR_IMPORT_PATH --envs N``
runs :func:`run_remote_env_worker`: it builds its envs here (the env is a gym id
or an import path resolved on this host: code never travels), says the one
``hello`` (``role="env"``) with their observation and action layouts, and once
welcomed steps exactly as a local env worker
(:class:`~asyncrl._inference.env_stepper.EnvStepper`), except that the observations
travel inline in each ``obs`` message and the policy outputs come back inline in each
``act`` answer (msgpack header + raw tensor frames, never pickle). Both ends decode
every message by its declared kind (:mod:`asyncrl._protocol.central_inference`),
bounded by the layouts agreed at join.

Torch-free, as a local env worker: ``asyncrl env-worker`` imports neither torch nor
tensordict (:mod:`asyncrl._spawn.torch_free`). Tensors arrive as numpy arrays and
its arrays leave as tensors (:mod:`transports._torch_free`); a chunk leaves as a
TensorDict built of its buffers (:class:`transports.ArrayDict`).
"""

from __future__ import annotations

import logging
import os
import random
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import numpy as np

from transports import (
    ArrayDict,
    CurveClient,
    ErrorPayload,
    Link,
    Message,
    PeerLostError,
    ProtocolError,
    random_identity,
)

from .._errors import JoinTimeout, RefusedError
from .._protocol import (
    PROTOCOL,
    Actions,
    EnvLayout,
    EnvWelcome,
    Hello,
    Refuse,
    ServedAnswer,
    ServedRoute,
    decode,
)
from .._protocol.central_inference import ERROR_KIND, WRITES_INFOS
from .._rollout.env_ids import EnvIdSource, is_unknown_env_id
from .._rollout.env_pools import EnvPool
from .._worker.log_forward import LogForwarder
from .._worker.served_calls import ServedCalls
from .env_stepper import EnvStepper, EnvWorkerConfig, build_pool, numpy_dtype

log = logging.getLogger("asyncrl.env_worker")

#: An inline block's layout: ``key -> (dtype name, shape)``.
Layout = dict[str, tuple[str, tuple[int, ...]]]


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
    allocated per step); what came from the network was decoded against the layout
    agreed at join first (:class:`~asyncrl._protocol.Actions`, :meth:`storage_layout`).
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

    def storage_layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """What an answer must hold, as this end stores it (bfloat16's bytes: uint16)."""
        return {k: (t.dtype.name, tuple(t.shape)) for k, t in self.tensors.items()}

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass


def pool_layout(pool: EnvPool) -> EnvLayout:
    """What a hello says about this host's envs: count, observations, action (per env)."""
    spec = pool.specs.action
    return EnvLayout(envs=pool.num_envs,
                     obs=[(a.dtype.name, list(a.shape[1:])) for a in pool.obs_arrays],  # type: ignore[misc]
                     action=(np.dtype(spec.dtype).name, list(spec.shape)))  # type: ignore[arg-type]


class RemoteStepper(EnvStepper):
    """An :class:`EnvStepper` whose observations and actions travel in the messages.

    ``served``: the calls of a host whose welcome named served modules: each step then
    runs in a thread while this loop reads the link (an env's call waits for its
    ``served_answer``: :meth:`ServedCalls.run_answering`).
    """

    _chunk: ArrayDict | None = None
    served: ServedCalls | None = None

    async def run(self, link: Link, *, recv: Callable[[], Awaitable[Message]] | None = None,
                  step: Callable[[int], Awaitable[bool]] | None = None) -> None:
        served = self.served
        if served is None:
            await super().run(link, recv=recv, step=step)
            return
        backlog: deque[Message] = deque()  # what came while a step ran: act, close, ...

        async def next_message() -> Message:
            while True:
                message = backlog.popleft() if backlog else await link.recv()
                if message.kind != ServedAnswer.KIND:
                    return message
                try:  # a late answer (its call timed out) is dropped there
                    served.deliver(message)
                except ProtocolError as exc:
                    log.warning("dropped a malformed served_answer: %s", exc)

        async def step_answering(version: int) -> bool:
            return await served.run_answering(lambda: self._step(version), link.recv, backlog)

        await super().run(link, recv=next_message, step=step_answering)

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
        answer = decode(Actions, body, layout=self.act_block.storage_layout(),
                        convert=_as_array)
        self.act_block.write(answer.arrays, version=answer.version)
        return read(self.act_dst, 0)


def served_calls(link: Link, welcome: EnvWelcome) -> ServedCalls | None:
    """The calls to the served modules ``welcome`` names, over ``link`` (on its event
    loop); None when it names none. A malformed route is a ProtocolError."""
    if not welcome.served:
        return None
    calls = ServedCalls(link)
    calls.bind()
    for config in welcome.served:
        calls.add(ServedRoute.from_config(config))
    calls.admitted()
    return calls


def welcome_config(welcome: EnvWelcome, pool: EnvPool, *, heartbeat_interval: float,
                   peer_timeout: float) -> tuple[EnvWorkerConfig, InlineArrays, InlineArrays]:
    """The stepper's config and its two inline blocks, from the collector's welcome."""
    obs = {f"o{i}": (a.dtype.name, tuple(a.shape)) for i, a in enumerate(pool.obs_arrays)}
    act = {k: (str(d), tuple(s)) for k, (d, s) in welcome.act.items()}
    config = EnvWorkerConfig(slot=welcome.slot, factories=[], create_env_kwargs={},
                             obs_block="", act_block="",
                             obs_paths=[tuple(p) for p in welcome.obs_paths],
                             extra_paths=[tuple(p) for p in welcome.extra_paths],
                             chunk_steps=welcome.chunk_steps,
                             heartbeat_interval=heartbeat_interval, peer_timeout=peer_timeout,
                             traj_tag=welcome.traj_tag,
                             info_columns=[(tuple(p), d, tuple(sh)) for p, d, sh in welcome.infos],
                             next_observations=not welcome.compact_obs)
    return config, InlineArrays(obs), InlineArrays(act)


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
    kwargs = dict(create_env_kwargs or {})
    # A gymnasium id this host's packages do not register (the trainer registers it at
    # run time): the hello names it, and the refusal says which module registers it.
    missing = env if is_unknown_env_id(env) else ""
    pool = None if missing else await anyio.to_thread.run_sync(build_pool, [env] * envs, kwargs)
    stepper: EnvStepper | None = None
    served: ServedCalls | None = None
    identity = random_identity(f"{socket.gethostname()}-{os.getpid()}-env")
    try:
        async with Link(connect, identity=identity, heartbeat_interval=interval,
                        peer_timeout=peer_timeout, curve=curve) as link:
            joined: tuple[EnvWelcome, EnvPool] | None = None
            with anyio.move_on_after(join_timeout):
                joined = await _join(link, pool, env, envs, kwargs, missing)
            if joined is None:
                raise JoinTimeout(
                    f"no welcome from {connect} within --join-timeout {join_timeout} s: "
                    "something accepts connections there but does not answer as an "
                    "AsyncBatchedCollector (a different service on that port, a trainer "
                    "whose event loop is blocked, or one whose remote_workers stayed full)")
            welcome, pool = joined
            config, obs, act = welcome_config(welcome, pool, heartbeat_interval=interval,
                                              peer_timeout=peer_timeout)
            try:  # (the welcome's info columns, say, on a TorchRL env: the collector hears why)
                stepper = RemoteStepper(config, pool=pool, blocks=(obs, act))
            except Exception as exc:
                pool = None  # (closed by the stepper)
                with anyio.move_on_after(2):
                    await link.send(ErrorPayload.from_exception(exc).to_body(),
                                    kind=ERROR_KIND)
                raise
            stepper.served = served = served_calls(link, welcome)
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
                    await link.send(ErrorPayload.from_exception(exc).to_body(),
                                    kind=ERROR_KIND)
                raise
    finally:
        if on_admission is not None:
            on_admission(False)
        if served is not None:
            served.close()
        if stepper is not None:
            stepper.close()
        elif pool is not None:
            pool.close()


#: How a collector of a release before the one hello refuses it (its own join's kind).
_OLDER_REFUSAL = "refused"
#: Pauses between two hellos of a host refused because the run is full (s), doubled
#: up to the last (jittered by a quarter): a place frees when a worker leaves.
_FULL_BACKOFF = (0.5, 8.0)


async def _join(link: Link, pool: EnvPool | None, env: Any, envs: int,
                kwargs: dict[str, Any], missing: str) -> tuple[EnvWelcome, EnvPool]:
    """The one hello (``role="env"``) until welcomed: again after a refusal for a full
    run (with a backoff), and once more after importing where the trainer's id is
    registered (``missing``: an id this host lacks). Any other refusal: RefusedError."""
    pause, attempt = _FULL_BACKOFF[0], 0
    while True:
        # Who we are, for the collector's statistics() and events() (not a credential).
        hello = Hello(protocol=PROTOCOL, name=link.identity.decode(errors="replace"),
                      host=socket.gethostname()[:200], pid=os.getpid(), role="env",
                      specs={} if pool is None else pool_layout(pool).to_specs(),
                      env_missing=missing, attempt=attempt,
                      # It writes the info columns its welcome names: said here, so that
                      # a trainer with info_keys can tell a host of an earlier release
                      # (which says nothing) at its hello, not at its first chunk.
                      rollout=dict(WRITES_INFOS))
        await link.send(hello.to_body(), kind=Hello.KIND)
        message = await link.recv()
        if message.kind == EnvWelcome.KIND:
            assert pool is not None  # (a hello without envs is refused, never welcomed)
            return decode(EnvWelcome, message.body), pool
        if message.kind == _OLDER_REFUSAL:  # a collector of a release before the one hello
            raise RefusedError(f"the collector at {link.endpoint} speaks the older join of "
                               "env workers ('env-hello'): run the same asyncrl release on "
                               f"the trainer and here (it said: {str(message.body)[:500]})")
        if message.kind != Refuse.KIND:
            raise ProtocolError(f"expected {EnvWelcome.KIND!r} or {Refuse.KIND!r}, got "
                                f"{str(message.kind)[:64]!r}")
        refuse = decode(Refuse, message.body)
        attempt += 1
        if refuse.env_source is not None and missing \
                and refuse.env_source["env_id"] == missing:
            source = EnvIdSource(**refuse.env_source)
            log.info("gymnasium id %r is registered by module %r: importing it",
                     source.env_id, source.module)
            missing = ""  # asked once: a second refusal is final
            try:
                await anyio.to_thread.run_sync(source.ensure)
                pool = await anyio.to_thread.run_sync(build_pool, [env] * envs, kwargs)
            except Exception as exc:
                raise RefusedError(f"the collector at {link.endpoint} refused this env "
                                   f"worker: {exc}") from None
        elif refuse.full:
            log.warning("the collector at %s is full (%s): asking again in %.1f s",
                        link.endpoint, refuse.reason, pause)
            await anyio.sleep(pause * random.uniform(0.75, 1.25))
            pause = min(2 * pause, _FULL_BACKOFF[1])
        else:
            raise RefusedError(f"the collector at {link.endpoint} refused this env worker: "
                               f"{refuse.reason}")


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


__all__ = ["InlineArrays", "JoinTimeout", "RemoteStepper", "describe", "pool_layout",
           "run_remote_env_worker"]
