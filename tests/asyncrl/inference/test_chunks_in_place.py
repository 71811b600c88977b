"""A local env worker records each chunk straight into its ring slot when that slot is free.

The hand-over then copies nothing (``EnvStepper.run_local``); when the trainer has not
taken the chunk a slot holds, the worker records the next chunk in its own buffers and
copies it in whole once a slot frees, as before. What must hold either way: every chunk
arrives once, whole and in order, each frame with its own answer's version, and a slot
the trainer has not taken is never written.
"""

from __future__ import annotations

import functools
import threading
import time

import pytest
import torch

from asyncrl._inference import spare_chunk
from asyncrl._inference.doorbell import EventFd
from asyncrl._inference.env_stepper import EnvStepper, EnvWorkerConfig
from asyncrl._inference.local_channels import LocalChannels
from asyncrl._inference.outputs import OutputLayout
from asyncrl.testing import CountingEnv
from tests.asyncrl.counting_frames import check_counting_frames

LIMIT = 30.0
STEPS = 4  # chunk columns; episodes of 5 steps: every chunk boundary cuts an episode
counting5 = functools.partial(CountingEnv, length=5)


class _AnswerAtOnce:
    """The inference loop's stand-in: the worker's k-th request is answered, as version k,
    when it rings; ``answered`` is set at the ``at``-th."""

    def __init__(self, word, at: int) -> None:
        self.word, self.asks, self.at = word, 0, at
        self.answered = threading.Event()

    def ring(self) -> None:
        self.asks += 1
        self.word[1] = self.asks
        self.word[0] += 2
        if self.asks == self.at:
            self.answered.set()


def _take(reader, bell: EventFd, deadline: float):
    while True:
        chunk = reader.take()
        if chunk is not None:
            return chunk
        assert time.monotonic() < deadline, "no chunk came"
        bell.wait(0.05)


@pytest.mark.parametrize("release_from", [None, 0], ids=["default", "every-array-released"])
def test_chunks_go_in_place_while_slots_are_free_and_whole_through_the_worker_when_not(
        release_from, monkeypatch) -> None:
    # 0: every array the worker's own buffers hold but the constant ones is given back
    # after each chunk copied out of them, so a column a step failed to rewrite would
    # arrive as zeros (spare_chunk.py)
    monkeypatch.setattr(spare_chunk, "RELEASE_THRESHOLD",
                        spare_chunk.RELEASE_THRESHOLD if release_from is None else release_from)
    channels = LocalChannels()
    channels.make([2], {("observation",): torch.zeros(1, 2)}, OutputLayout(
        action=(torch.int64, ())), splits=1, chunk_steps=STEPS, frames_per_batch=8, flat=False)
    ring, reader, blocks = channels.rings[0], channels.readers[0], channels.blocks[0]
    assert ring.slots == 2
    word = blocks.act.control(0)
    # Chunks 1 and 2 fill the ring; chunk 3 is recorded by the worker (1 initial request
    # and one per column: the 13th request is the last of chunk 3), which then waits.
    server = _AnswerAtOnce(word, at=1 + 3 * STEPS)
    stepper = EnvStepper(EnvWorkerConfig(
        slot=3, factories=[counting5] * 2, create_env_kwargs={}, obs_block=blocks.obs.name,
        act_block=blocks.act.name, obs_paths=[("observation",)], extra_paths=[],
        chunk_steps=STEPS, request_bell=server, answer_bell=channels.answer_bells[0],  # type: ignore[arg-type]
        spin=0.0, chunk_ring=ring.names, chunk_bell=channels.chunk_bell,
        room_bell=channels.room_bells[0]))
    released = stepper._spare.releasable
    assert (len(released) > 3) == (release_from == 0), released
    thread = threading.Thread(target=stepper.run_local, daemon=True)
    chunks = []
    deadline = time.monotonic() + LIMIT
    try:
        thread.start()
        assert server.answered.wait(LIMIT)
        bell, room = channels.chunk_bell, channels.room_bells[0]
        assert bell is not None
        chunks.append(_take(reader, bell, deadline))  # chunk 1: slot 0, untouched meanwhile
        room.ring()  # chunk 3 goes in, copied from the worker's buffers
        chunks += [_take(reader, bell, deadline), _take(reader, bell, deadline)]
        # chunks 4 and 5: in place or through the worker, as the takes fall
        room.ring()
        chunks += [_take(reader, bell, deadline), _take(reader, bell, deadline)]
    finally:
        stepper.stop()
        assert stepper.wait_stopped(LIMIT)
        thread.join(LIMIT)
        word.release()
        stepper.close()
        channels.close()
    frames = torch.cat(chunks, 1)  # [2 envs, 5 chunks x STEPS]
    n = 5 * STEPS
    assert frames.batch_size == (2, n)
    for env in range(2):  # each env's 20 steps, in order: 4 whole episodes of 5
        assert frames["observation"][env, :, 0].tolist() == [0, 1, 2, 3, 4] * 4
        assert frames["observation"][env, :, 1].tolist() == [e for e in range(4) for _ in range(5)]
        # the k-th request (all envs at once) was answered as version k
        assert frames["collector", "policy_version"][env].tolist() == list(range(1, n + 1))
        assert frames["collector", "worker_id"][env].tolist() == [3] * n  # its slot's
    check_counting_frames(frames.reshape(-1), length=5, action=0)
