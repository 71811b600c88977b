"""A worker: envs + policy + rollout, driven by a coordinator over one :class:`Link`.

The same code runs in a locally spawned process and on a remote host. The
rollout runs in a thread (``anyio.to_thread``) so that the event loop keeps
answering heartbeats, control messages and weight updates while envs step.
Weights are applied at step boundaries by the rollout's ``before_step`` hook,
never while the policy runs.

This module is the worker's state machine: build, join, serve (collect, dispatch
the coordinator's messages), and join again or exit. Its parts live beside it: the
hello said until welcomed (:mod:`.join`), a lost coordinator (:mod:`.reconnect`),
control operations (:mod:`.control`), how a batch leaves (:mod:`.outgoing`),
progress reports (:mod:`.progress`) and weights (:class:`~asyncrl.weights.WeightApplier`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections import deque
from collections.abc import Callable
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import anyio
import anyio.abc

from transports import (
    CurveClient,
    ErrorPayload,
    Link,
    Message,
    PeerLostError,
    ProtocolError,
    RateLimitedLog,
)

from .._errors import WorkerExit
from .._protocol import (
    PROTOCOL,
    WEIGHTS_KIND,
    BatchSlots,
    Closing,
    Collect,
    Control,
    ErrorReport,
    Hello,
    Leaving,
    Preempt,
    Refuse,
    Rejoin,
    ServedAnswer,
    decode,
)
from .._rollout.env_ids import EnvIdSource, is_unknown_env_id
from .._rollout.loop import Rollout
from .._rollout.options import RolloutOptions
from .._rollout.reach import user_env
from .._spawn.child import remove_orphaned_socket_dir, wait_parent_gone
from .._spawn.exit_codes import (
    EXIT_COORDINATOR_LOST,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_REJOIN,
)
from .._spawn.stop_signals import STOP_SIGNALS, ignore_stop_signals
from .._spawn.threads import use_torch_threads
from ..weights import WeightApplier
from .control import TOUCHES_WEIGHTS, run_control
from .join import EnvOffered, Joining
from .log_forward import LogForwarder
from .outgoing import OutgoingBatches
from .progress import ProgressReport
from .reconnect import await_next_trainer, hub_lost, ride_out, wait_for_coordinator
from .relay_member import RelayMembership
from .served_calls import ServedCalls
from .spec import WorkerSpec

log = logging.getLogger("asyncrl.worker")


def error_report(error: BaseException, *, fatal: bool = True, slot: int = -1,
                 token: str = "") -> ErrorReport:
    return ErrorReport(ErrorPayload.from_exception(error), fatal=fatal, slot=slot, token=token)


class Worker:
    """One worker's state machine. Build with a connected link, then ``await run()``."""

    def __init__(self, link: Link, spec: WorkerSpec, *, slot: int = -1, token: str = "",
                 parent_pid: int | None = None, reconnect: bool = False,
                 reconnect_timeout: float = 3600.0, give_up_after: float = 0.0,
                 relay_link: Link | None = None,
                 relay_name: str = "", handle_signals: bool = False,
                 on_admission: Callable[[bool], None] | None = None,
                 join_timeout: float | None = None,
                 log_forwarder: LogForwarder | None = None,
                 group: tuple[str, int] = ("", 0)) -> None:
        self.link = link
        #: This worker's host and how many workers it brings: they join together.
        self.group = group
        #: This process's log records go to the coordinator while it admits us.
        self.log_forwarder = log_forwarder
        self._is_admitted = False
        #: Told True when a coordinator welcomed us, False when that admission ended
        #: (what a worker host's readiness probe reports; see asyncrl._observe.probes).
        self.on_admission = on_admission
        #: Without ``reconnect``: how long an admitted worker whose coordinator's
        #: connection went down (a cut link) waits for that same coordinator to come
        #: back before it exits (0: it exits at once).
        self.give_up_after = give_up_after
        #: Stop cleanly on SIGTERM/SIGINT (a process's main thread only: signal handlers).
        self.handle_signals = handle_signals
        self._leaving = False  # a signal asked us to stop: told the coordinator, awaiting close
        self._trainer_stopping = False  # its close said the run goes on without it
        self._next_trainer_planned = False  # waiting for the trainer that said so
        self.relay_link = relay_link  # this host's relay, if any: weights may come that way
        self.reconnect = reconnect
        self.reconnect_timeout = reconnect_timeout
        self.spec = spec
        self.slot = slot
        self.token = token
        self.parent_pid = parent_pid
        self.env_pool: Any = None
        self.policy: Any = None
        self.rollout: Rollout | None = None
        self.index = -1
        self.instance = ""  # the coordinator instance that welcomed us last
        self._requests: deque[int] = deque()
        self._request_ready = anyio.Event()
        self._busy = anyio.Lock()  # held while the rollout or a control op uses the envs
        self._current_request: int | None = None
        self._preempted: int | None = None  # the latest request the coordinator cut short
        # Weights come from the coordinator or the relay, and are acked the way they came.
        self._weights = WeightApplier(link, relay=relay_link, busy=self._busy.locked)
        self._relay = RelayMembership(relay_link, relay_name, self._weights)
        # What the network makes us log is rate-limited (a malformed message is dropped).
        self._limited_log = RateLimitedLog(log)
        # Bound on one join, hello to welcome (join_timeout; None: none).
        self._joining = Joining(link, self._recv, join_timeout=join_timeout,
                                limited_log=self._limited_log)
        self._progress = ProgressReport(link, self.collecting)  # slow is not hung
        self._exit: WorkerExit | None = None
        self._outgoing = OutgoingBatches()  # shared-memory slots, or the wire (compact?)
        self._env_missing = ""  # a host's --env id unknown here: asked of the coordinator
        #: A remote worker's calls to the trainer's served modules, over this link (a
        #: worker spawned by the collector calls them through shared memory).
        self.served_calls = ServedCalls(link) if slot < 0 else None
        self._backlog: deque[Message] = deque()  # read while the rollout was built

    @property
    def env(self) -> Any:
        """The user's env: model ids such as ``"env.transform[0]"`` resolve from here.

        A TorchRL env as the user built it (its transforms included), else
        asyncrl's pool of gymnasium envs.
        """
        return user_env(self.env_pool)

    # -- life cycle --------------------------------------------------------------
    async def run(self) -> int:
        """Serve until closed, refused or orphaned; return the exit code."""
        code = EXIT_OK

        async def serve() -> None:
            nonlocal code
            code = await self._serve()
            tg.cancel_scope.cancel()

        async def watch_parent() -> None:
            # For the whole life of the worker, also while it joins or waits for a
            # coordinator: a spawned worker must never outlive the process that made it.
            nonlocal code
            try:
                await self._watch_parent()
            except WorkerExit as exc:
                log.error("worker exits: %s", exc)
                code = exc.code
                if self.rollout is not None:
                    self.rollout.request_stop()  # the batch in progress ends at its next step
                for link in (self.link, self.relay_link):
                    if link is not None:
                        remove_orphaned_socket_dir(link.endpoint)
                tg.cancel_scope.cancel()

        async def watch_signals(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            nonlocal code
            code = await self._watch_signals(task_status)
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            if self.handle_signals:
                # Before anything else: building the envs and the policy takes seconds
                # without a yield, and a SIGTERM then (a pod stopped while it starts)
                # would end the process by the default action, with no goodbye.
                await tg.start(watch_signals)
            tg.start_soon(serve)
            tg.start_soon(watch_parent)
            if self.log_forwarder is not None:
                tg.start_soon(self.log_forwarder.forward, self.link, self._admitted_now)
        return code

    async def _watch_signals(self, task_status: anyio.abc.TaskStatus[None]) -> int:
        """SIGTERM (systemd stops a whole process group) or SIGINT: stop, as a normal exit.

        ``task_status`` is told once the handlers are in place. A signal that comes
        while the worker builds its envs waits for the build to end (no yield there).

        The coordinator is told why, and answers with a close: the link's goodbye
        comes only after that, so that the coordinator takes this as a stop, not as
        a lost worker (and a send of its to a closed pipe cannot make it one). The
        batch in progress is abandoned; the envs are closed on the way out.
        """
        received = False
        try:  # leave while the receiver still holds the handlers: a second SIGTERM waits
            with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
                task_status.started()
                async for signum in signals:
                    received = True
                    await self._leave_on_signal(signal.Signals(signum).name)
                    break
        finally:
            if received:  # the receiver gave the default handlers back: a second SIGTERM
                ignore_stop_signals()  # (a host forwards the group's) must not kill us (-15)
        return EXIT_OK

    async def _leave_on_signal(self, name: str) -> None:
        log.info("worker %d got %s: stopping", self.index, name)
        self._leaving = True
        if self.rollout is not None:
            self.rollout.request_stop()  # the batch in progress ends at its next step
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await self.link.send(Leaving(name).to_body(), kind=Leaving.KIND)
        if self.index >= 0:
            # The coordinator's close ends serve() and with it this task; a
            # coordinator that is gone or busy gets a bounded wait.
            await anyio.sleep(2 * self.link.heartbeat_interval + 1.0)

    async def _serve(self) -> int:
        if self.served_calls is not None:
            self.served_calls.bind()
        try:
            await self._build()
            while True:
                try:
                    await self._join()
                except WorkerExit as exc:
                    self._exit = exc  # no coordinator yet: with `reconnect`, wait for one
                else:
                    self._exit = None
                    self._admitted(True)
                    if self.served_calls is not None:
                        self.served_calls.admitted()
                    try:
                        async with anyio.create_task_group() as tg:
                            for task in (self._collect_loop, self._weights.send_acks,
                                         self._dispatch_loop, self._relay.receive_weights,
                                         self._progress.run):
                                tg.start_soon(self._until_exit, task, tg.cancel_scope)
                    finally:
                        self._admitted(False)
                        if self.served_calls is not None:
                            self.served_calls.lost(f"this worker's admission by the trainer at "
                                                   f"{self.link.endpoint} ended")
                if self._exit is None:
                    return EXIT_OK
                if self._exit.code == EXIT_REJOIN:
                    log.warning("%s: joining again", self._exit)
                    continue
                if self._exit.code != EXIT_COORDINATOR_LOST or self._exit.final:
                    raise self._exit
                if self.reconnect and self._trainer_stopping:
                    self._trainer_stopping = False
                    self._next_trainer_planned = True  # its welcome is no surprise
                    await await_next_trainer(self.link, self.give_up_after)
                elif self.reconnect:
                    log.warning("%s; waiting for it to come back", self._exit)
                    await wait_for_coordinator(self.link, self.reconnect_timeout)
                else:
                    await ride_out(self.link, self._exit, admitted=self.index >= 0,
                                   give_up_after=self.give_up_after)
        except WorkerExit as exc:
            if self._leaving:  # stopping on a signal: a coordinator gone meanwhile is fine
                log.info("worker exits: %s", exc)
                return EXIT_OK
            if exc.code != EXIT_OK:
                log.error("worker exits: %s", exc)
            return exc.code
        finally:
            self._outgoing.detach()
            self._close_envs()
            if self.served_calls is not None:
                self.served_calls.close()

    def _admitted_now(self) -> bool:
        return self._is_admitted

    def _admitted(self, admitted: bool) -> None:
        self._is_admitted = admitted
        if self.on_admission is not None:
            self.on_admission(admitted)

    async def _until_exit(self, task: Any, scope: anyio.CancelScope) -> None:
        """Run one of the worker's loops; the first to finish or exit stops them all."""
        try:
            await task()
        except WorkerExit as exc:
            self._exit = self._exit or exc
        if self.rollout is not None:
            self.rollout.request_stop()  # a batch in progress is abandoned, not delivered
        scope.cancel()

    async def _build(self) -> None:
        use_torch_threads(self.spec.torch_threads)
        try:
            if self.slot < 0 and self.spec.env_source is None \
                    and is_unknown_env_id(self.spec.create_env_fn):
                # A host's --env id that the trainer registers at run time (a package it
                # imports, its own gymnasium.register): the hello asks where it comes from.
                self._env_missing = self.spec.create_env_fn
            else:
                self.env_pool = self.spec.make_env_pool()
            self.policy = self.spec.make_policy()
            self._weights.add_schemes(self.spec.weight_sync_schemes or {}, root=self)
        except Exception as exc:
            await self._report_and_exit(exc)

    async def _join(self) -> None:
        """Hello, welcome, and a rollout for the index we were given."""
        self._requests.clear()  # credits of an earlier admission are void
        self._outgoing.detach()  # and so is its segment: a new admission starts on the wire
        await self._relay.attach()
        while True:
            hello = Hello(protocol=PROTOCOL, name=self.link.identity.decode(errors="replace"),
                          host=socket.gethostname(), pid=os.getpid(),
                          specs={} if self.env_pool is None else self.env_pool.specs.to_dict(),
                          slot=self.slot, token=self.token,
                          relay=self._relay.hello_name, group=self.group[0],
                          group_size=self.group[1], drops_next_obs=True,
                          env_missing=self._env_missing,
                          rollout=self.spec.rollout.to_wire())
            try:
                welcome = await self._joining.hello_until_welcome(hello)
                break
            except EnvOffered as offer:
                await self._take_env_source(offer.source)
        self.index = welcome.index
        self._outgoing.welcomed(welcome)  # compact batches, compact_obs
        if welcome.instance and welcome.instance != self.instance:
            if self.instance:
                # A trainer that said it was only stopping (a rollout, a drain) is
                # expected back: INFO; one that vanished and came back: WARNING.
                level = logging.INFO if self._next_trainer_planned else logging.WARNING
                log.log(level, "joined a restarted coordinator (instance %s, was %s): weight "
                        "versions are the new one's", welcome.instance, self.instance)
            self.instance = welcome.instance
        self._next_trainer_planned = False
        try:
            # Receivers for the models the coordinator syncs that our spec did not name
            # (a remote worker calls a served module instead: its route is kept).
            calls = self.served_calls
            schemes = welcome.schemes if calls is None else calls.take(welcome.schemes,
                                                                       welcome.served)
            self._weights.add_configs(schemes, root=self)
            # A restarted trainer numbers its versions from 1 again: before its
            # catch-up weights are read, forget what the old one's numbers meant.
            self._weights.follow(self.instance)
            # Receivers that join a process group (broadcast scheme) need the index.
            self._weights.admitted(welcome.index)
            # The run's rollout options, over this host's devices (and its own options,
            # for a coordinator before they travelled): built anew at every admission.
            options = RolloutOptions.from_wire(welcome.rollout, base=self.spec.rollout)
            build = partial(
                Rollout, self.env_pool, self.policy, welcome.share_frames,
                worker_index=welcome.index, init_random_frames=welcome.init_random_frames,
                options=options, next_observations=not welcome.compact_obs)
            if calls is not None and calls.routes:
                # Its first (probing) step may call a served module over this link.
                calls.admitted()
                self.rollout = await calls.run_answering(build, self._recv_link,
                                                          self._backlog)
            else:
                self.rollout = build()
        except WorkerExit:
            raise
        except Exception as exc:
            await self._report_and_exit(exc)
        assert self.rollout is not None
        self._weights.attach(self.rollout)
        for message in self._joining.early:
            self._weights.deliver(message)  # idle: applied now
        self._joining.early.clear()
        await self._weights.flush_acks()

    async def _take_env_source(self, source: EnvIdSource) -> None:
        """Import where the trainer's id comes from, build the envs (or exit naming why)."""
        log.info("gymnasium id %r is registered by module %r: importing it", source.env_id,
                 source.module)
        self._env_missing = ""  # asked once: a second refusal is final
        try:
            self.spec.env_source = source
            self.env_pool = self.spec.make_env_pool()
        except Exception as exc:
            raise WorkerExit(EXIT_REFUSED, f"the coordinator refused this worker: {exc}") \
                from None

    # -- messages ------------------------------------------------------------------
    async def _recv(self) -> Message:
        if self._backlog:
            return self._backlog.popleft()
        return await self._recv_link()

    async def _recv_link(self) -> Message:
        try:
            return await self.link.recv()
        except PeerLostError as exc:
            raise hub_lost(self.link, exc, welcomed=self.index >= 0) from None

    async def _dispatch_loop(self) -> None:
        while True:
            message = await self._recv()
            try:
                if message.kind == Collect.KIND:
                    collect = decode(Collect, message.body)
                    self._requests.extend([collect.request] * collect.credits)
                    self._request_ready.set()
                elif message.kind == Rejoin.KIND:
                    reason = decode(Rejoin, message.body).reason
                    raise WorkerExit(EXIT_REJOIN, "the coordinator dropped this worker"
                                     + (f" ({reason})" if reason else ""))
                elif message.kind == Preempt.KIND:
                    request = decode(Preempt, message.body).request
                    self._preempted = request  # also cuts a batch not started yet
                    if self._current_request == request and self.rollout is not None:
                        self.rollout.request_stop()
                elif message.kind == WEIGHTS_KIND:
                    self._weights.deliver(message)
                elif message.kind == BatchSlots.KIND:
                    self._outgoing.offered(decode(BatchSlots, message.body))
                elif message.kind == ServedAnswer.KIND and self.served_calls is not None:
                    self.served_calls.deliver(message)
                elif message.kind == Control.KIND:
                    control = decode(Control, message.body)
                    if control.op == "close":
                        await self._on_close(message, control)
                        return
                    await self._control(message, control)
                elif message.kind == Refuse.KIND:
                    # Dropped after joining (e.g. a batch that was not what was asked).
                    reason = decode(Refuse, message.body).reason
                    raise WorkerExit(EXIT_REFUSED, f"the coordinator dropped this worker: "
                                     f"{reason}", final=True)
                else:
                    log.warning("ignored a %r message", message.kind)
            except ProtocolError as exc:  # every decode raises only this (see decode())
                self._limited_log.warning("bad-message", "dropped a malformed %r message: %s",
                                          message.kind, exc)
                if message.needs_ack:
                    await self.link.ack(message, error=exc)

    async def _on_close(self, message: Message, control: Control) -> None:
        """Told to stop: go home if the run is over; with ``reconnect``, if the trainer
        only stops (SIGTERM, a rollout restart), wait for the next one instead."""
        if self.rollout is not None:
            self.rollout.request_stop()  # end a running batch at its next step
        try:
            finished = decode(Closing, control.args).finished
        except ProtocolError as exc:  # hostile or broken: the bounded wait is the safe side
            log.warning("a close with a malformed argument (%s): taken as a trainer that "
                        "stops before the end", exc)
            finished = False
        await self.link.ack(message, result=None)
        if not finished and self.reconnect and not self._leaving:
            self._trainer_stopping = True
            raise WorkerExit(EXIT_COORDINATOR_LOST, f"the trainer at {self.link.endpoint} is "
                             "stopping before the run finished")

    async def _control(self, message: Message, control: Control) -> None:
        async with self._busy:
            try:
                if control.op in TOUCHES_WEIGHTS:
                    await self._weights.model_whole()  # not while a version is written in
                result = run_control(control, rollout=self.rollout, policy=self.policy,
                                     env_pool=self.env_pool)
            except Exception as exc:
                await self.link.ack(message, error=exc)
                return
        await self.link.ack(message, result=result)

    # -- collecting -------------------------------------------------------------------
    async def _collect_loop(self) -> None:
        assert self.rollout is not None
        while True:
            while not self._requests:
                await self._request_ready.wait()
                self._request_ready = anyio.Event()
            request = self._requests.popleft()
            async with self._busy:
                self._current_request = request
                try:
                    message = await anyio.to_thread.run_sync(self._collect_one, request)
                except Exception as exc:
                    await self._report_and_exit(exc)
                finally:
                    self._current_request = None
                self._weights.after_batch()
            if self._leaving:  # cut short by a signal: not a batch anyone asked for
                await anyio.sleep_forever()
            await self.link.send(message.to_body(), kind=message.KIND)

    def collecting(self) -> tuple[int, int] | None:
        """(request, env steps done) while a batch is collected, else None."""
        request, rollout = self._current_request, self.rollout
        return None if request is None or rollout is None else (request, rollout.steps_done)

    def _collect_one(self, request: int) -> Any:
        assert self.rollout is not None
        use_torch_threads(self.spec.torch_threads)  # this is a pool thread, not the main one
        # A share preempted before it started is sent empty: the round is waiting.
        max_steps = 0 if request == self._preempted else None
        return self._outgoing.take(self.rollout.collect(max_steps), request)

    async def _report_and_exit(self, error: BaseException) -> None:
        log.error("worker error: %s", error)
        with anyio.CancelScope(shield=True):
            # slot and token: a report sent before our hello was answered still counts.
            report = error_report(error, slot=self.slot, token=self.token)
            await self.link.send(report.to_body(), kind=ErrorReport.KIND)
        raise WorkerExit(EXIT_ERROR, f"{type(error).__name__}: {error}") from error

    async def _watch_parent(self) -> None:
        # A spawned worker must not outlive its trainer, even if it never says goodbye.
        parent = self.parent_pid
        if parent is None:
            await anyio.sleep_forever()
            return
        await wait_parent_gone(parent)
        raise WorkerExit(EXIT_COORDINATOR_LOST, "the parent process is gone", final=True)

    def _close_envs(self) -> None:
        if self.env_pool is not None:
            try:
                self.env_pool.close()
            except Exception:
                log.exception("closing the envs failed")


async def run_worker(endpoint: str, spec: WorkerSpec, *, identity: bytes | None = None,
                     slot: int = -1, token: str = "", parent_pid: int | None = None,
                     heartbeat_interval: float = 1.0, peer_timeout: float = 10.0,
                     reconnect: bool = False, reconnect_timeout: float = 3600.0,
                     give_up_after: float = 0.0,
                     curve_keys: str | CurveClient | None = None, relay: str | None = None,
                     relay_name: bytes | str = b"", handle_signals: bool = False,
                     admission: Any = None, join_timeout: float | None = None,
                     log_forwarder: LogForwarder | None = None,
                     group: tuple[str, int] = ("", 0), **link_options: Any) -> int:
    """Connect to the coordinator at ``endpoint`` and serve until told to close.

    With ``reconnect=True`` a worker whose coordinator went silent waits (up to
    ``reconnect_timeout`` s) for it, or a restarted one, and joins again with
    the latest weights; otherwise an admitted worker whose coordinator's connection
    went down waits ``give_up_after`` s for that same coordinator (a cut link), then
    exits. ``curve_keys`` is a directory made by ``asyncrl keys`` (CURVE encryption
    and authentication), or the keys themselves (:class:`~transports.CurveClient`);
    None: no CURVE. ``relay``
    is the endpoint of this host's :class:`~asyncrl._worker.relay.HostRelay` and
    ``relay_name`` its identity: weight updates may then come through it. Returns an exit
    code: 0 when closed by the coordinator, 1 on an env or policy error (reported to the
    coordinator first), 3 when the coordinator is gone, 4 when refused, 5 when no welcome
    came within ``join_timeout`` s (None: no bound). With ``join_timeout``, a worker
    refused only because the run is full asks again (backing off from 0.5 s to 8 s)
    until a place frees or the timeout passes; any other refusal is final. With
    ``handle_signals`` (a worker process's main thread) SIGTERM and SIGINT stop it
    cleanly: the coordinator is told first (a ``leaving`` message), the envs are
    closed, and it returns 0. ``log_forwarder`` (installed on this process's root
    logger, see :mod:`asyncrl._worker.log_forward`) sends the process's log records to
    the coordinator while it admits this worker. ``group`` (a host's name for itself,
    and how many workers it brings) asks the coordinator to admit them all or none.
    """
    if curve_keys is not None:
        link_options["curve"] = CurveClient.load(curve_keys)
    async with AsyncExitStack() as stack:
        link = await stack.enter_async_context(
            Link(endpoint, identity=identity, heartbeat_interval=heartbeat_interval,
                 peer_timeout=peer_timeout, **link_options))
        relay_link = None
        if relay is not None:  # same identity: the relay knows its members by it
            relay_link = await stack.enter_async_context(
                Link(relay, identity=link.identity, heartbeat_interval=heartbeat_interval,
                     peer_timeout=peer_timeout))
        if isinstance(relay_name, bytes):
            relay_name = relay_name.decode(errors="replace")
        on_admission = None if admission is None else partial(admission.set, link.identity)
        worker = Worker(link, spec, slot=slot, token=token, parent_pid=parent_pid,
                        reconnect=reconnect, reconnect_timeout=reconnect_timeout,
                        give_up_after=give_up_after, relay_link=relay_link,
                        relay_name=relay_name, handle_signals=handle_signals,
                        on_admission=on_admission, join_timeout=join_timeout,
                        log_forwarder=log_forwarder, group=group)
        return await worker.run()
