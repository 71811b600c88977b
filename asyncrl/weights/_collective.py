"""A private torch.distributed process group for one model's weights: form it, broadcast on it.

The trainer is rank 0; worker ``i`` (its index in the run) is rank ``i + 1``.
The group is made without touching torch.distributed's global state (no
``init_process_group``): a trainer that trains with DDP keeps its own default
group. Formation goes through a ``TCPStore`` that the trainer serves at the
scheme's ``init_method``:

1. the trainer publishes its flat layout (keys, dtypes, shapes);
2. each worker compares it with its own model and answers ``joined/<rank>``
   (``ok``, or why not: a worker with another architecture is named before any
   collective runs);
3. once every rank answered, the trainer says ``go`` (or ``abort: why``) and
   every rank builds the process group (gloo's full mesh, or NCCL's communicator).

Every wait of the formation polls in short slices so that a closing trainer or
worker stops it, and is bounded by ``join_timeout``; every broadcast by
``timeout`` (the process group's own). A rank that dies breaks the group for good: gloo reports
"Connection closed by peer" at the next collective, and nothing can rejoin.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.distributed as _dist

from transports import ProtocolError

from ._errors import WeightSyncError

# torch.distributed's stores and process-group classes are untyped re-exports.
dist: Any = _dist

__all__ = ["ALGORITHMS", "CHAIN_CHUNK_BYTES", "FlatLayout", "Group", "chain_order",
           "check_group_options", "free_port", "parse_init_method"]

#: Each tensor starts on a multiple of this many bytes (any dtype's alignment).
ALIGN = 64
#: Polling slice of the formation's waits (seconds): how fast a close stops them.
POLL = 0.05
BACKENDS = ("gloo", "nccl")
#: ``"broadcast"``: the backend's own collective; ``"chain"``: rank r receives each chunk
#: from r - 1 and forwards it to r + 1 as it comes (a pipeline: one copy per link).
ALGORITHMS = ("broadcast", "chain")
CHAIN_CHUNK_BYTES = 1 << 20


def parse_init_method(init_method: str) -> tuple[str, int]:
    """``"tcp://HOST:PORT"`` -> ``(host, port)``; anything else raises ``ValueError``."""
    parts = urlsplit(init_method) if isinstance(init_method, str) else None
    try:
        port = parts.port if parts is not None else None
    except ValueError:
        port = None
    if parts is None or parts.scheme != "tcp" or not parts.hostname or port is None \
            or parts.path not in ("", "/"):
        raise ValueError(f"init_method must be 'tcp://HOST:PORT' (the trainer's address, which "
                         f"the workers reach), got {init_method!r}")
    return parts.hostname, port


def check_group_options(*, backend: str, algorithm: str, chunk_bytes: int | None,
                        init_method: str | None, world_size: int | None, timeout: float,
                        join_timeout: float) -> None:
    """Raise ``ValueError`` naming the first option of a process group that cannot work."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if algorithm == "chain" and backend == "nccl":
        raise ValueError("algorithm='chain' is for gloo: NCCL's own broadcast already "
                         "pipelines along a ring (use algorithm='broadcast' with nccl)")
    if chunk_bytes is not None:
        if algorithm != "chain":
            raise ValueError(f"chunk_bytes={chunk_bytes!r} is the piece of "
                             "algorithm='chain'; the backend's broadcast cuts its own. "
                             "Pass algorithm='chain' with it, or leave chunk_bytes out")
        if type(chunk_bytes) is not int or not 4096 <= chunk_bytes <= 1 << 30:
            raise ValueError(f"chunk_bytes must be an int in [4096, 2**30], "
                             f"got {chunk_bytes!r}")
    if init_method is not None:
        parse_init_method(init_method)
    if world_size is not None and (type(world_size) is not int or world_size < 2):
        raise ValueError(f"world_size must be an int >= 2 (the trainer and at least one "
                         f"worker), got {world_size!r}")
    for name, value in (("timeout", timeout), ("join_timeout", join_timeout)):
        if not isinstance(value, int | float) or not 0 < value <= 86400:
            raise ValueError(f"{name} must be seconds in (0, 86400], got {value!r}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the trainer's store binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class FlatLayout:
    """Where each tensor of a model lives in one contiguous byte buffer.

    >>> from torch import nn
    >>> layout = FlatLayout.of(dict(nn.Linear(2, 1).state_dict()))
    >>> [(key, offset) for key, _, _, offset in layout.entries], layout.nbytes
    ([('bias', 0), ('weight', 64)], 72)
    """

    #: ``(key, dtype name, shape, byte offset)``, sorted by key.
    entries: tuple[tuple[str, str, tuple[int, ...], int], ...]
    nbytes: int

    @classmethod
    def of(cls, flat: Mapping[str, torch.Tensor]) -> FlatLayout:
        entries = []
        offset = 0
        for key in sorted(flat):
            tensor = flat[key]
            entries.append((key, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape),
                            offset))
            size = tensor.numel() * tensor.element_size()
            offset += -(-size // ALIGN) * ALIGN if size else 0
        last = flat[entries[-1][0]] if entries else None
        nbytes = entries[-1][3] + last.numel() * last.element_size() if last is not None else 0
        return cls(tuple(entries), nbytes)

    def describe(self) -> str:
        return json.dumps([[k, d, list(s)] for k, d, s, _ in self.entries])

    def claims(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """``{key: (dtype name, shape)}``: what :func:`read_layout` reads back from
        :meth:`describe`."""
        return {k: (d, s) for k, d, s, _ in self.entries}

    def difference(self, other_description: str) -> str:
        """Empty if the other side described the same layout, else what differs."""
        try:
            theirs = read_layout(other_description)
        except ProtocolError:
            return "the trainer's layout description is malformed"
        ours = {k: (d, s) for k, d, s, _ in self.entries}
        missing = sorted(set(theirs) - set(ours))
        unexpected = sorted(set(ours) - set(theirs))
        wrong = [f"{k}: trainer {theirs[k]}, worker {ours[k]}"
                 for k in sorted(set(ours) & set(theirs)) if ours[k] != theirs[k]]
        parts = []
        if missing:
            parts.append(f"missing here {missing[:10]}")
        if unexpected:
            parts.append(f"not on the trainer {unexpected[:10]}")
        if wrong:
            parts.append("dtype or shape differ: " + "; ".join(wrong[:10]))
        return ", ".join(parts)

    def empty(self, device: torch.device, *, pin: bool = False) -> torch.Tensor:
        return torch.empty(max(self.nbytes, 1), dtype=torch.uint8, device=device,
                           pin_memory=pin)

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{key: tensor}`` sharing ``buffer``'s memory."""
        out = {}
        for key, dtype_name, shape, offset in self.entries:
            dtype = getattr(torch, dtype_name)
            count = 1
            for dim in shape:
                count *= dim
            size = count * torch.empty((), dtype=dtype).element_size()
            out[key] = buffer[offset:offset + size].view(dtype).view(shape)
        return out


#: Bounds of a layout description read from a peer (the tensor key, the number of dims;
#: a dim may claim at most 2**48 elements): nothing is allocated from what it claims,
#: but an error message quotes it.
MAX_LAYOUT_KEY, MAX_DIMS, MAX_DIM = 1024, 64, 1 << 48
#: The dtype names a layout may say: a fixed set (``getattr(torch, name)`` on a peer's
#: name could import a submodule: ``torch.__getattr__`` loads some lazily).
DTYPE_NAMES = frozenset(str(d).removeprefix("torch.") for d in vars(torch).values()
                        if isinstance(d, torch.dtype))


def read_layout(description: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{key: (dtype name, shape)}`` from a peer's :meth:`FlatLayout.describe`, checked.

    Raises ``ProtocolError`` for anything but a JSON list of distinct
    ``[key, dtype name, [dims]]`` entries within the bounds above, whatever the text
    (deep nesting included).

    >>> read_layout('[["bias", "float32", [2]]]')
    {'bias': ('float32', (2,))}
    """
    try:
        entries = json.loads(description)
    except (ValueError, RecursionError) as exc:  # (a deeply nested text: RecursionError)
        raise ProtocolError(f"a weight layout must be JSON, got {type(exc).__name__}: "
                            f"{str(exc)[:200]}") from None
    if not isinstance(entries, list):
        raise ProtocolError(f"a weight layout must be a list, got {type(entries).__name__}")
    claims: dict[str, tuple[str, tuple[int, ...]]] = {}
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and 0 < len(entry[0]) <= MAX_LAYOUT_KEY and isinstance(entry[1], str)
                and entry[1] in DTYPE_NAMES
                and isinstance(entry[2], list) and len(entry[2]) <= MAX_DIMS
                and all(type(d) is int and 0 <= d <= MAX_DIM for d in entry[2])):
            raise ProtocolError(
                f"a weight layout entry must be [key (1 to {MAX_LAYOUT_KEY} characters), a "
                f"torch dtype name, [at most {MAX_DIMS} dims in 0..2**48]], got {entry!r:.200}")
        if entry[0] in claims:
            raise ProtocolError(f"a weight layout names {entry[0][:200]!r} twice")
        claims[entry[0]] = (entry[1], tuple(entry[2]))
    return claims


class Group:
    """One rank's handle on the process group: ``broadcast(buffer)`` from rank 0, bounded."""

    def __init__(self, pg: Any, rank: int, world_size: int, backend: str, timeout: float,
                 store: Any, *, algorithm: str = "broadcast",
                 chunk_bytes: int = CHAIN_CHUNK_BYTES, order: list[int] | None = None) -> None:
        self.pg = pg
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.timeout = timeout
        self.algorithm = algorithm
        self.chunk_bytes = chunk_bytes
        #: The chain's path, rank 0 first: this rank receives from ``before``, sends to
        #: ``after`` (the ranks host by host, :func:`chain_order`).
        self.order = list(range(world_size)) if order is None else list(order)
        at = self.order.index(rank)
        self.before = self.order[at - 1] if at else None
        self.after = self.order[at + 1] if at + 1 < world_size else None
        self._store = store  # rank 0 serves it: kept alive with the group

    def broadcast(self, buffer: torch.Tensor) -> None:
        """Rank 0 sends ``buffer``, the others receive into it; blocks (a thread), bounded."""
        if self.algorithm == "chain":
            self._chain(buffer)
            return
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = datetime.timedelta(seconds=self.timeout)
        work = self.pg.broadcast([buffer], options)
        if self.backend == "nccl":
            work.wait(datetime.timedelta(seconds=self.timeout))
            torch.cuda.current_stream(buffer.device).synchronize()
        else:
            work.wait()  # gloo: bounded by the group's timeout

    def _chain(self, buffer: torch.Tensor) -> None:
        """A pipelined chain 0 -> 1 -> ... -> n-1 in ``chunk_bytes`` pieces (gloo point to point).

        gloo's own broadcast sends the whole buffer down a tree, stage after stage: the
        trainer's link carries one copy per child and the last rank waits for every stage.
        Along a chain each link carries one copy, and a rank forwards a chunk while the next
        one arrives, so the last rank has it all about one buffer's time after the first
        byte left (plus a chunk per hop). The chain visits the ranks host by host
        (:func:`chain_order`), so each host's link carries one copy in and one out.
        """
        span = datetime.timedelta(seconds=self.timeout)
        flat = buffer.view(-1)
        sends = []
        for tag, start in enumerate(range(0, flat.numel(), self.chunk_bytes)):
            chunk = flat[start:start + self.chunk_bytes]
            if self.before is not None:
                with self._naming("receiving from", self.before):
                    self.pg.recv([chunk], self.before, tag).wait(span)
            if self.after is not None:
                sends.append(self.pg.send([chunk], self.after, tag))
        with self._naming("sending to", self.after):
            for work in sends:
                work.wait(span)

    @contextlib.contextmanager
    def _naming(self, what: str, rank: int | None) -> Iterator[None]:
        """A failed link of the chain names the rank at its other end: the frozen or dead
        one, not this healthy rank that timed out waiting for it."""
        try:
            yield
        except Exception as exc:
            who = "the trainer" if rank == 0 else f"worker {rank - 1 if rank else '?'}"
            raise WeightSyncError(
                f"chain rank {self.rank}: {what} rank {rank} ({who}) failed within "
                f"{self.timeout} s: rank {rank} is frozen or dead "
                f"({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})"
            ) from exc

    def close(self) -> None:
        pg, self.pg = self.pg, None
        self._store = None
        if pg is not None and self.backend == "nccl":
            try:
                pg.abort()  # frees the communicator; no collective may be in flight
            except Exception:  # pragma: no cover - best effort at shutdown
                pass

    # -- formation ------------------------------------------------------------------------
    @classmethod
    def form(cls, init_method: str, *, world_size: int, backend: str, timeout: float,
             join_timeout: float, layout: FlatLayout, prefix: str,
             stop: threading.Event, **chain: Any) -> Group:
        """Rank 0 (the trainer): serve the store, check every worker's answer, build the group."""
        host, port = parse_init_method(init_method)
        span = datetime.timedelta(seconds=join_timeout)
        server = dist.TCPStore(host, port, None, True, span, wait_for_workers=False)
        store = dist.PrefixStore(prefix, server)
        store.set("layout", layout.describe())
        keys = [f"joined/{rank}" for rank in range(1, world_size)]
        deadline = time.monotonic() + join_timeout
        while not store.check(keys):
            _tick(stop, deadline, lambda: (
                f"worker rank(s) {[k.split('/')[1] for k in keys if not store.check([k])]} of "
                f"{world_size - 1} did not join the process group at {init_method} within "
                f"{join_timeout} s (join_timeout; each joins right after its welcome)"))
        refusals = [f"rank {k.split('/')[1]}: {v}" for k in keys
                    if (v := store.get(k).decode(errors="replace")) != "ok"]
        if refusals:
            store.set("go", "abort: " + "; ".join(refusals))
            raise WeightSyncError(
                "worker(s) refused the process group, their model differs from the trainer's: "
                + "; ".join(refusals) + ". Check that trainer and workers build the same "
                "architecture")
        order = chain_order({rank: store.get(f"address/{rank}").decode(errors="replace")
                             for rank in range(1, world_size)})
        store.set("order", json.dumps(order))
        store.set("go", "ok")
        return cls(_make_pg(store, 0, world_size, backend, timeout, host), 0, world_size,
                   backend, timeout, server, order=order, **chain)

    @classmethod
    def join(cls, init_method: str, *, rank: int, world_size: int, backend: str,
             timeout: float, join_timeout: float, layout: FlatLayout, prefix: str,
             stop: threading.Event, **chain: Any) -> Group:
        """Rank ``rank`` (a worker): check the trainer's layout, answer, build the group."""
        if not 1 <= rank < world_size:
            raise WeightSyncError(
                f"this worker would be rank {rank} of a process group of {world_size} "
                f"(the trainer and {world_size - 1} workers, fixed when the collector was "
                "made): it has no place in it. DistributedWeightSyncScheme cannot admit "
                "extra or replacement workers; use ZmqWeightSyncScheme for that")
        host, port = parse_init_method(init_method)
        span = datetime.timedelta(seconds=join_timeout)
        store = dist.PrefixStore(prefix, dist.TCPStore(host, port, None, False, span))
        deadline = time.monotonic() + join_timeout
        while not store.check(["layout"]):
            _tick(stop, deadline, lambda: f"the trainer's store at {init_method} published no "
                                          f"weight layout within {join_timeout} s")
        difference = layout.difference(store.get("layout").decode(errors="replace"))
        address = _address_towards(host)
        store.set(f"address/{rank}", address)  # (before joined/: the trainer reads it then)
        store.set(f"joined/{rank}", difference or "ok")
        if difference:
            raise WeightSyncError(f"this worker's model differs from the trainer's "
                                  f"({difference}): it cannot join the process group. Check "
                                  "that trainer and workers build the same architecture")
        while not store.check(["go"]):
            _tick(stop, deadline, lambda: f"the trainer did not start the process group "
                                          f"within {join_timeout} s (another worker missing?)")
        go = store.get("go").decode(errors="replace")
        if go != "ok":
            raise WeightSyncError(f"the trainer aborted the process group: {go}")
        order = _parse_order(store.get("order"), world_size)
        return cls(_make_pg(store, rank, world_size, backend, timeout, address),
                   rank, world_size, backend, timeout, None, order=order, **chain)


def chain_order(addresses: Mapping[int, str]) -> list[int]:
    """The chain's path: rank 0, then the workers host by host (``{rank: address}``).

    Worker indices follow the order in which workers joined, which interleaves hosts
    that start together; grouped by address, each host's link carries one copy in and
    one out instead of one per worker.

    >>> chain_order({1: "10.0.0.2", 2: "10.0.0.3", 3: "10.0.0.2", 4: "10.0.0.3"})
    [0, 1, 3, 2, 4]
    """
    first: dict[str, int] = {}
    for rank in sorted(addresses):
        first.setdefault(addresses[rank], rank)
    return [0, *sorted(addresses, key=lambda rank: (first[addresses[rank]], rank))]


def _parse_order(raw: bytes, world_size: int) -> list[int]:
    try:
        order = json.loads(raw)
    except ValueError:
        order = None
    if not isinstance(order, list) or sorted(order) != list(range(world_size)) \
            or order[0] != 0:
        raise WeightSyncError(f"the trainer's chain order {raw[:200]!r} is not a permutation "
                              f"of ranks 0..{world_size - 1} starting at 0")
    return order


def _tick(stop: threading.Event, deadline: float, why: Any) -> None:
    if stop.is_set():
        raise WeightSyncError("closed while forming the process group")
    if time.monotonic() > deadline:
        raise TimeoutError(why())
    stop.wait(POLL)


def _make_pg(store: Any, rank: int, world_size: int, backend: str, timeout: float,
             address: str) -> Any:
    span = datetime.timedelta(seconds=timeout)
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise WeightSyncError("backend='nccl' but this torch build has no NCCL (a CPU "
                                  "wheel?): use backend='gloo'")
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = span
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = span
    # The address this rank listens on for its peers: the one that reaches the trainer
    # (gloo's default resolves the host name, which may not be reachable).
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    return dist.ProcessGroupGloo(store, rank, world_size, options)


def _address_towards(host: str) -> str:
    """This host's address on the route to ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1" if host in ("127.0.0.1", "localhost") else socket.gethostname()
