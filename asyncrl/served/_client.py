"""The caller's end of a served module: claim a slot, ask, wait (bounded), read the answer.

A :class:`ServedModuleClient` runs in the env's process (an env worker, local to the
trainer's host). It claims one of the module's client slots (a byte-range lock on the
claim file: the kernel releases it when the process dies, so a lost worker's slot is
free again without anyone cleaning up), attaches that slot's request and answer blocks
(:class:`transports.SharedArrayBlock`, numpy views: no torch needed) and its bells
(:class:`~._bells.FifoBell`), and calls through them exactly as a central-inference env
worker asks for actions (:mod:`asyncrl._inference.block_io`, the blocks' seqlock):

1. wait until the slot's previous request is answered (a call that timed out may still
   be answered late: its answer must not be taken for this one's);
2. write the inputs into the request block (its sequence number moves by two), ring
   the server's request bell;
3. wait on the answer bell until the answer block's sequence number catches up, the
   status says the module closed or failed (an error at once, with the reason), or
   ``call_timeout`` passed (:class:`~._errors.ServedModuleTimeout`);
4. copy the output out; the answer's version word is the module's weights version.

Nothing in a call allocates but the output's copy.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import numpy as np

from transports import SharedArrayBlock, TransportError

from .._inference.block_io import SlotArrays
from .._inference.doorbell import spin_then_block
from ._bells import FifoBell
from ._errors import ServedModuleError, ServedModuleTimeout
from ._handle import ServedModuleHandle
from ._status import CLOSED, SERVING, read_status

__all__ = ["CLAIMS_FILE", "REQUEST_BELL", "ServedModuleClient", "answer_bell"]

CLAIMS_FILE = "claims"
REQUEST_BELL = "request"


def answer_bell(slot: int) -> str:
    """The file name of client slot ``slot``'s answer bell."""
    return f"answer{slot}"


class _Claims:
    """This process's claims on one module's slots, through one descriptor of its claim file.

    POSIX record locks belong to the process, and closing *any* descriptor of the file
    drops them all: so one descriptor per file and process, closed with the last claim.
    """

    _lock = threading.Lock()
    _open: dict[tuple[int, str], _Claims] = {}

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self.held: set[int] = set()

    @classmethod
    def claim(cls, directory: str, count: int, name: str) -> int:
        path = os.path.join(directory, CLAIMS_FILE)
        with cls._lock:
            key = (os.getpid(), path)  # a forked child holds none of its parent's locks
            claims = cls._open.get(key)
            if claims is None:
                try:
                    claims = cls._open[key] = cls(path)
                except FileNotFoundError:
                    raise ServedModuleError(
                        f"served module {name!r} is not served (any more): its directory "
                        f"{directory} is gone; open the ServedModule ('async with') before "
                        "the envs that call it, and keep it open while they run") from None
            for slot in range(count):
                if slot in claims.held:
                    continue
                try:
                    fcntl.lockf(claims.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
                except OSError:
                    continue  # another process's
                claims.held.add(slot)
                return slot
            if not claims.held:
                os.close(claims.fd)
                del cls._open[key]
        raise ServedModuleError(
            f"served module {name!r}: all its {count} client slots are taken (one per env "
            f"that calls it); give ServedModule(..., clients=) at least the number of envs "
            "across all workers")

    @classmethod
    def release(cls, directory: str, slot: int) -> None:
        path = os.path.join(directory, CLAIMS_FILE)
        with cls._lock:
            key = (os.getpid(), path)
            claims = cls._open.get(key)
            if claims is None or slot not in claims.held:
                return
            claims.held.discard(slot)
            try:
                fcntl.lockf(claims.fd, fcntl.LOCK_UN, 1, slot)
            except OSError:
                pass
            if not claims.held:
                os.close(claims.fd)
                del cls._open[key]


def fill_inputs(name: str, fields: Sequence[tuple[str, str, Sequence[int]]],
                sources: Sequence[np.ndarray], inputs: Mapping[str, Any] | Sequence[Any]
                ) -> None:
    """Check one env's ``inputs`` (by name, or in ``fields``' order) and cast them into
    ``sources`` (one array per input, of its dtype and shape)."""
    names = [n for n, _, _ in fields]
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ServedModuleError(f"served module {name!r} takes inputs {names}; this call "
                                    f"lacks {missing}")
        values = [inputs[n] for n in names]
    else:
        values = list(inputs)
        if len(values) != len(fields):
            raise ServedModuleError(f"served module {name!r} takes {len(fields)} inputs "
                                    f"{names}, got {len(values)}")
    for source, value, (field, dtype, shape) in zip(sources, values, fields, strict=True):
        array = np.asarray(value)
        if array.size != source.size:
            raise ServedModuleError(
                f"served module {name!r}: input {field!r} has shape {tuple(array.shape)}, "
                f"expected {tuple(shape)} ({dtype}, one env's values)")
        np.copyto(source, array.reshape(source.shape), casting="same_kind")


class ServedModuleClient:
    """One caller of a served module: ``output, version = client(inputs)``.

    ``inputs``: one array per input of the module, by name (a mapping) or in the
    handle's order, each of the input's shape (one env's values, no batch dimension).
    ``output`` is a fresh array of the output's shape; ``version`` the weights version
    that computed it. Close it (idempotent) to free its slot; a process that ends frees
    its slots anyway.

    >>> client = ServedModuleClient(served.handle)          # doctest: +SKIP
    >>> reward, version = client({"observation": obs, "action": action})  # doctest: +SKIP
    """

    def __init__(self, handle: ServedModuleHandle) -> None:
        if handle.host != socket.gethostname():
            raise ServedModuleError(
                f"served module {handle.name!r} is served on host {handle.host!r}; this "
                f"process runs on {socket.gethostname()!r}: a served module reaches the "
                "processes of its own host only (shared memory); a remote worker's env calls "
                "it by name over its link (ServedReward(env, name), the module registered in "
                "its collector's weight_sync_schemes), or run the envs on the trainer's host")
        self.handle = handle
        self.slot = _Claims.claim(handle.directory, handle.clients, handle.name)
        self._closed = False
        self._blocks: list[SharedArrayBlock] = []
        self._bells: list[FifoBell] = []
        try:
            self._attach(handle)
        except BaseException:
            self.close()
            raise

    def _attach(self, handle: ServedModuleHandle) -> None:
        request_name, answer_name = handle.blocks[self.slot]
        try:
            request, answer, status = (SharedArrayBlock.attach(n) for n in (
                request_name, answer_name, handle.status))
        except TransportError:
            raise ServedModuleError(f"served module {handle.name!r} is not served (any "
                                    "more): its shared memory is gone; keep the ServedModule "
                                    "open while the envs that call it run") from None
        self._blocks += [request, answer, status]
        self._request, self._answer = SlotArrays(request), SlotArrays(answer)
        self._status = status.slot_views(0)
        directory = handle.directory
        self._request_bell = FifoBell(os.path.join(directory, REQUEST_BELL))
        self._bells.append(self._request_bell)
        self._answer_bell = FifoBell(os.path.join(directory, answer_bell(self.slot)))
        self._bells.append(self._answer_bell)
        # A caller that died mid-write left the sequence number odd: the server never
        # reads such a request, so put the number back to the last whole request.
        word = self._request.word
        if word[0] & 1:
            word[0] -= 1
        # One env's inputs, staged here (checked and cast), then copied in by the seqlock.
        self._sources = [np.zeros(a.shape, dtype=a.dtype) for a in self._request.arrays]
        self._copies = self._request.copies_from(self._sources)
        self._output: Any = self._answer.arrays[0]
        self._shape = handle.output[2]

    @property
    def closed(self) -> bool:
        return self._closed

    def __call__(self, inputs: Mapping[str, Any] | Sequence[Any]) -> tuple[np.ndarray, int]:
        if self._closed:
            raise ServedModuleError(f"this client of served module {self.handle.name!r} "
                                    "is closed")
        self._fill(inputs)
        handle = self.handle
        deadline = time.monotonic() + handle.call_timeout
        request, answer = self._request.word, self._answer.word
        if not self._wait(lambda: answer[0] == request[0], deadline):
            raise self._late("the answer to this env's previous call (which timed out)")
        seq = self._request.publish(self._copies, version=0)
        self._request_bell.ring()
        if not self._wait(lambda: answer[0] == seq, deadline):
            raise self._late("its answer")
        output = np.array(self._output, copy=True).reshape(self._shape)
        return output, int(answer[1])

    def _fill(self, inputs: Mapping[str, Any] | Sequence[Any]) -> None:
        fill_inputs(self.handle.name, self.handle.inputs, self._sources, inputs)

    @property
    def name(self) -> str:
        """The module's name (model id)."""
        return self.handle.name

    @property
    def input_names(self) -> tuple[str, ...]:
        """The module's inputs, in order."""
        return self.handle.input_names

    @property
    def output_shape(self) -> tuple[int, ...]:
        """One env's output's shape."""
        return tuple(self.handle.output[2])

    def _wait(self, ready: Any, deadline: float) -> bool:
        if spin_then_block(ready, self._answer_bell, spin=self.handle.spin,
                           stopped=self._stopped, deadline=deadline):
            return True
        self._raise_if_stopped()
        return False

    async def call_async(self, inputs: Mapping[str, Any] | Sequence[Any]
                         ) -> tuple[np.ndarray, int]:
        """:meth:`__call__` for an event loop: the waits are the loop's, not a thread's
        (the trainer's end of remote workers' calls, :mod:`._remote_calls`)."""
        if self._closed:
            raise ServedModuleError(f"this client of served module {self.handle.name!r} "
                                    "is closed")
        self._fill(inputs)
        deadline = time.monotonic() + self.handle.call_timeout
        request, answer = self._request.word, self._answer.word
        if not await self._wait_async(lambda: answer[0] == request[0], deadline):
            raise self._late("the answer to this slot's previous call (which timed out)")
        seq = self._request.publish(self._copies, version=0)
        self._request_bell.ring()
        if not await self._wait_async(lambda: answer[0] == seq, deadline):
            raise self._late("its answer")
        output = np.array(self._output, copy=True).reshape(self._shape)
        return output, int(answer[1])

    async def _wait_async(self, ready: Any, deadline: float) -> bool:
        bell = self._answer_bell
        while not ready():
            self._raise_if_stopped()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # The server rings after each answer and at a change of status; the bound
            # only covers a ring lost to a full pipe.
            with anyio.move_on_after(min(remaining, 0.5)):
                await anyio.wait_readable(bell.fd)
            bell.wait(timeout=0)  # drain
        return True

    def _stopped(self) -> bool:
        return int(self._status["state"][0]) != SERVING

    def _raise_if_stopped(self) -> None:
        if not self._stopped():
            return
        state, message = read_status(self._status)
        name = self.handle.name
        if state == CLOSED:
            raise ServedModuleError(f"served module {name!r} was closed while this env "
                                    "called it: close the collector before the "
                                    "ServedModule it calls")
        raise ServedModuleError(f"served module {name!r} failed and serves no more "
                                f"calls: {message}")

    def _late(self, what: str) -> ServedModuleTimeout:
        handle = self.handle
        serving = ("its host process" if handle.server_backend == "process"
                   else "the trainer's process")
        return ServedModuleTimeout(
            f"served module {handle.name!r} (pid {handle.pid}) did not send {what} within "
            f"call_timeout={handle.call_timeout} s (slot {self.slot}); {serving} "
            "may be blocked, paused or gone: check it, or raise ServedModule(..., "
            "call_timeout=) for a slow module")

    def close(self) -> None:
        """Let go of the slot and the shared memory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for slot_arrays in ("_request", "_answer"):
            arrays = getattr(self, slot_arrays, None)
            if arrays is not None:
                arrays.release()
        self._status = {}
        self._output = None
        self._sources, self._copies = [], []
        for bell in self._bells:
            bell.close()
        for block in self._blocks:
            block.close()
        self._bells, self._blocks = [], []
        _Claims.release(self.handle.directory, self.slot)
