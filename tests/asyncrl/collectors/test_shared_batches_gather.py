"""A sync round's batch gathered from the workers' slots with one copy, as ``assemble`` lays it out.

Without processes: a :class:`BatchSink` (its :class:`SharedBatches` and
:class:`RoundGather`), the workers' :class:`SlotWriter` and a :class:`Round`. Each
case checks the batch bit for bit against ``assemble`` of the same shares taken off
the wire (today's path), and
whether it was gathered with one copy (the shares are views of the batch) or,
for a round that did not go as planned, joined by ``assemble``.
"""

from __future__ import annotations

import doctest
from typing import Any

import pytest
from tensordict import TensorDictBase

import asyncrl._coordinator.batch_sink
import asyncrl._coordinator.round_gather
import asyncrl._coordinator.shared_batches
import asyncrl._worker.batch_slots
from asyncrl import CollectorStatistics
from asyncrl._coordinator.batch_sink import BatchSink
from asyncrl._coordinator.records import Round, WorkerInfo
from asyncrl._protocol import Batch
from asyncrl._worker.batch_slots import SlotWriter
from asyncrl.collectors._assemble import assemble
from tests.asyncrl.collectors.test_shared_batches import differences, offered, pixel_share, wire
from tests.asyncrl.coordinator.rules import shm_config
from transports import SharedMemoryFullError, decode, encode

STEPS, WORKERS = 4, 3


class Bench:
    """Three workers (index order = peer order), all but ``socket`` ones with a segment."""

    def __init__(self, cat_results: Any, envs: int, socket: tuple[int, ...] = ()) -> None:
        share_frames = [envs * STEPS] * WORKERS
        self.sink = BatchSink(shm_config(sync=True, cat_results=cat_results,
                                         share_frames=share_frames))
        self.shared = self.sink.shared
        self.cat_results, self.envs = cat_results, envs
        self.infos = [WorkerInfo(i, f"w{i}".encode(), f"w{i}", "h", 10 + i)
                      for i in range(WORKERS)]
        self.writers: dict[int, SlotWriter] = {}
        for info in self.infos:
            if info.index not in socket:
                _, self.writers[info.index] = offered(self.shared, self.share(info.index), info)
        self.round = Round(1, {info.peer: info for info in self.infos})

    def share(self, index: int, steps: int = STEPS) -> TensorDictBase:
        return pixel_share(steps, envs=self.envs, seed=index)

    def deliver(self, index: int, steps: int = STEPS) -> None:
        info, share = self.infos[index], self.share(index, steps)
        writer = self.writers.get(index)
        if writer is None:
            frames = wire(share)  # a socket share, decoded
        else:
            notice = writer.write(share, self.round.request)
            assert notice is not None
            frames = self.sink.from_slot(info, notice, self.round).frames
        self.round.shares[info.peer] = frames

    def batch(self) -> tuple[TensorDictBase, TensorDictBase, bool]:
        """The batch, today's batch, and whether the shares are views of the batch."""
        shares = [self.round.shares[i.peer] for i in self.infos if i.peer in self.round.shares]
        today = assemble([self.share(i.index, s.shape[1]) for i, s in zip(
            [i for i in self.infos if i.peer in self.round.shares], shares, strict=True)],
            self.cat_results)
        got = self.sink.join(shares)
        first = next(s for i, s in zip(self.infos, shares, strict=False) if i.index in self.writers)
        one_copy = first["pixels"].untyped_storage().data_ptr() == \
            got["pixels"].untyped_storage().data_ptr()
        return got, today, one_copy

    def close(self) -> None:
        for writer in self.writers.values():
            writer.detach()
        self.shared.close()


@pytest.fixture
def bench(request: Any) -> Any:
    made: list[Bench] = []

    def make(*args: Any, **kwargs: Any) -> Bench:
        made.append(Bench(*args, **kwargs))
        return made[-1]

    yield make
    for one in made:
        one.close()


CASES = [(cat, envs) for cat in ("stack", 0, -1) for envs in (1, 2)]


@pytest.mark.parametrize(("cat_results", "envs"), CASES)
def test_whole_shares_are_gathered_with_one_copy(bench: Any, cat_results: Any,
                                                 envs: int) -> None:
    b = bench(cat_results, envs)
    for index in (2, 0, 1):  # in any order of arrival
        b.deliver(index)
    got, today, one_copy = b.batch()
    assert differences(got, today) == []
    assert one_copy


@pytest.mark.parametrize(("cat_results", "envs"), CASES)
def test_a_socket_share_is_copied_into_its_place(bench: Any, cat_results: Any,
                                                  envs: int) -> None:
    b = bench(cat_results, envs, socket=(0,))  # its first batch crossed the socket
    for index in range(WORKERS):
        b.deliver(index)
    got, today, one_copy = b.batch()
    assert differences(got, today) == []
    assert one_copy


@pytest.mark.parametrize(("cat_results", "envs", "gathered"), [
    ("stack", 1, True), ("stack", 2, True), (0, 2, True),
    (0, 1, False), (-1, 2, False)])  # along time a short share moves the next regions
def test_a_preempted_share_is_padded_and_masked_as_assemble_does(
        bench: Any, cat_results: Any, envs: int, gathered: bool) -> None:
    b = bench(cat_results, envs, socket=(2,))
    b.deliver(0)
    b.deliver(1, steps=1)
    b.deliver(2, steps=3)  # a short socket share too
    got, today, one_copy = b.batch()
    assert differences(got, today) == []
    assert one_copy is gathered
    if cat_results == "stack":
        assert got["collector", "mask"].sum().item() == envs * (STEPS + 1 + 3)


def test_a_round_that_went_otherwise_is_joined_by_assemble(bench: Any) -> None:
    lost = bench("stack", 2)
    lost.deliver(0)
    lost.deliver(2)  # worker 1 was lost before it delivered: two shares
    got, today, one_copy = lost.batch()
    assert (differences(got, today), one_copy) == ([], False)
    short = bench("stack", 2)
    for index in range(WORKERS):
        short.deliver(index, steps=2)  # every share cut short: a narrower batch
    got, today, one_copy = short.batch()
    assert (differences(got, today), got.batch_size, one_copy) == ([], (3, 2, 2), False)


def test_a_stale_or_second_share_is_copied_out_as_before(bench: Any) -> None:
    b = bench(0, 2)
    b.deliver(0)
    stale = b.writers[1].write(b.share(1), request=0)  # an earlier round's
    assert stale is not None
    frames = b.sink.from_slot(b.infos[1], stale, b.round).frames
    assert differences(frames, b.share(1)) == []
    again = b.writers[0].write(b.share(0), b.round.request)  # worker 0 already delivered
    assert again is not None
    frames = b.sink.from_slot(b.infos[0], again, b.round).frames
    assert differences(frames, b.share(0)) == []
    assert frames["pixels"].untyped_storage().data_ptr() != \
        b.round.shares[b"w0"]["pixels"].untyped_storage().data_ptr()


def test_the_slot_is_free_once_its_share_is_in_the_round(bench: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(asyncrl._worker.batch_slots, "HELD_WAIT", 0.01)
    b = bench("stack", 2)
    b.deliver(0)  # slot 0, read at once into the round's batch
    writer = b.writers[0]
    for request in (5, 6):  # slot 1, then slot 0 again: no wait for the round to end
        assert writer.write(b.share(0), request) is not None


def test_counts_say_how_each_batch_came_and_who_a_full_dev_shm_kept_on_the_socket(
        bench: Any, monkeypatch: Any) -> None:
    b = bench("stack", 2, socket=(2,))
    for index in range(WORKERS):
        b.deliver(index)
    body = Batch(1, b.share(2)).to_body()
    b.sink.from_socket(b.infos[2], decode(encode(body)))
    nbytes = sum(v.numel() * v.element_size()
                 for v in b.share(0).values(include_nested=True, leaves_only=True))
    assert b.sink.counts() == {"shared_memory_batches": 2, "shared_memory_bytes": 2 * nbytes,
                                 "socket_batches": 1, "socket_bytes": nbytes,
                                 "shared_memory_fallbacks": 0}
    assert [(i.arrivals.shared_memory_batches, i.arrivals.socket_batches) for i in b.infos] \
        == [(1, 0), (1, 0), (0, 1)]

    def full(*args: Any, **kwargs: Any) -> Any:
        raise SharedMemoryFullError("asyncrl_1_ab", needed=30 << 20, free=1 << 20)

    monkeypatch.setattr(asyncrl._coordinator.shared_batches.SharedTensorFile, "create", full)
    sink = BatchSink(shm_config(share_frames=[8] * 3))
    for index, (peer, local) in enumerate(((b"a", True), (b"b", True), (b"r", False))):
        sink.shared.admitted(peer, local=local)  # the remote one is no fallback
        assert sink.shared.offer(WorkerInfo(index, peer, "w", "h", 1), b.share(0)) is None
    assert sink.counts()["shared_memory_fallbacks"] == 2


def test_doctests() -> None:
    assert doctest.testmod(asyncrl._coordinator.round_gather).failed == 0
    assert doctest.testmod(asyncrl._coordinator.batch_sink).failed == 0


def test_prometheus_exports_the_arrival_counts() -> None:
    pytest.importorskip("prometheus_client")
    from tests.asyncrl.observe.test_metrics import Snapshot, scrape

    stats = CollectorStatistics(shared_memory_batches=6, shared_memory_bytes=600,
                                socket_batches=2, socket_bytes=150, shared_memory_fallbacks=1)
    lines = scrape(Snapshot(stats))
    for line in ['asyncrl_batches_arrived_total{channel="shared_memory"} 6.0',
                 'asyncrl_batches_arrived_total{channel="socket"} 2.0',
                 'asyncrl_batch_bytes_arrived_total{channel="shared_memory"} 600.0',
                 'asyncrl_batch_bytes_arrived_total{channel="socket"} 150.0',
                 "asyncrl_shared_memory_fallbacks_total 1.0"]:
        assert line in lines
