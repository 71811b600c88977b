"""Elastic membership in the coordinator's state: departures, places, re-planned work.

A worker that leaves cleanly (its host got SIGTERM and said so) is a departure,
not a failure, under every ``on_worker_loss``: what it owed goes to the others
(async credits granted again, its share of a sync round asked of a live worker),
so that rounds and ``total_frames`` stay exact; its place is free for a newcomer
at once. A hello refused only because the run is full says so (``full``), so
that the worker may ask again.
"""

from __future__ import annotations

import pytest

from asyncrl._coordinator.state import CatchUp, Expel, Send
from asyncrl._protocol import Batch, Collect, Preempt, Refuse, Welcome

from .test_coordinator_state import FRAMES, admit, hello, share, state, sync_state, welcome

LOSS_MODES = ["raise", "continue", "wait", "restart"]


@pytest.mark.parametrize("on_worker_loss", LOSS_MODES)
def test_a_departed_workers_share_is_asked_of_a_worker_that_delivered(on_worker_loss) -> None:
    s, _ = sync_state(3, on_worker_loss=on_worker_loss)
    round_, _ = s.start_round()
    assert s.batch(b"w2", Batch(1, share(2))) == []  # w2 is done with this round
    assert s.losses.departed(b"w1") == [Expel(b"w1"), Send(b"w2", Collect(1, 1))]
    assert s.losses.failure is None and not round_.complete
    assert s.batch(b"w0", Batch(1, share(0))) == [] and not round_.complete
    assert s.batch(b"w2", Batch(1, share(2))) == [] and round_.complete
    shares = s.rounds.end_round(round_)
    assert [w.index for w, _ in shares] == [0, 2, 2]  # as many shares as asked: exact
    assert sum(frames.numel() for _, frames in shares) == 3 * FRAMES
    # Nobody waits for it: the next round asks the two that are left.
    assert s.losses.missing_workers() <= 0
    round2, actions = s.start_round()
    assert actions == [Send(b"w0", Collect(2, 1)), Send(b"w2", Collect(2, 1))]
    assert round2.replacements == 0


def test_a_departed_workers_share_goes_to_the_least_loaded_when_none_delivered() -> None:
    s, _ = sync_state(3)
    round_, _ = s.start_round()
    assert s.losses.departed(b"w0") == [Expel(b"w0"), Send(b"w1", Collect(1, 1))]
    # w1 owes two shares now: the next departure's share goes to w2.
    assert s.losses.departed(b"w1") == [Expel(b"w1"), Send(b"w2", Collect(1, 1)),
                                 Send(b"w2", Collect(1, 1))]
    assert round_.unfinished(b"w2") == 3
    for _ in range(3):
        assert not round_.complete
        s.batch(b"w2", Batch(1, share(2)))
    assert round_.complete and len(s.rounds.end_round(round_)) == 3


def test_a_preempted_round_cuts_a_replanned_share_short_too() -> None:
    s, _ = sync_state(3, preemptive_threshold=0.5)
    round_, _ = s.start_round()
    s.batch(b"w0", Batch(1, share(0)))
    assert s.batch(b"w1", Batch(1, share(1))) == [Send(b"w2", Preempt(1))]
    assert s.losses.departed(b"w2") == [Expel(b"w2"), Send(b"w0", Collect(1, 1)),
                                 Send(b"w0", Preempt(1))]
    assert s.batch(b"w0", Batch(1, share(0, steps=0))) == [] and round_.complete


def test_with_nobody_left_a_departed_share_waits_for_a_newcomer() -> None:
    s, _ = sync_state(1, accept_remote=True)
    round_, _ = s.start_round()
    assert s.losses.departed(b"w0") == [Expel(b"w0")]
    assert round_.replacements == 1 and not round_.complete and s.losses.failure is None
    actions = s.hello(b"new", hello())
    assert actions[-1] == Send(b"new", Collect(1, 1))
    s.batch(b"new", Batch(1, share(s.roster.workers[b"new"].index)))
    assert round_.complete


@pytest.mark.parametrize("on_worker_loss", LOSS_MODES)
def test_a_departed_workers_credits_go_to_the_others_and_the_total_stays_exact(
        on_worker_loss) -> None:
    s = state(prefetch=2, batch_budget=5, on_worker_loss=on_worker_loss)
    a, b = admit(s, b"a"), admit(s, b"b")
    assert (a.credits, b.credits, s.rounds.budget) == (2, 2, 1)
    s.batch(b"a", Batch(a.index, share(a.index)))  # one of its batches is delivered...
    assert s.losses.departed(b"a") == [Expel(b"a")]  # ...b is at prefetch already
    assert s.losses.failure is None and s.rounds.budget == 2  # its one undelivered credit is back
    assert s.rounds.take() is not None  # its delivered batch still counts
    assert s.losses.written_off == 0 and s.losses.departures == 1


def test_a_departure_frees_its_place_at_once_and_full_refusals_say_so() -> None:
    s = state(max_remote_workers=1)
    admit(s, b"first")
    refused = s.hello(b"second", hello(pid=2))
    assert len(refused) == 1 and isinstance(refused[0].message, Refuse)
    assert refused[0].message.full  # only full: the worker may ask again
    s.losses.departed(b"first")
    actions = s.hello(b"second", hello(pid=2, attempt=1))
    second = s.roster.workers[b"second"]
    assert actions[:2] == [Send(b"second", welcome(second.index, attempt=1)), CatchUp(second)]


def test_a_refusal_for_any_other_reason_is_not_full() -> None:
    s = state(max_remote_workers=1, accept_remote=False)
    [refused] = s.hello(b"x", hello())
    assert isinstance(refused.message, Refuse) and not refused.message.full


def test_a_lost_worker_under_raise_still_fails_the_run() -> None:
    # Only a goodbye is a departure: a closed connection without one is a loss.
    s, _ = sync_state(2, on_worker_loss="raise")
    s.start_round()
    s.losses.lost(b"w1", "disconnected")
    assert s.losses.failure is not None and "closed its connection" in str(s.losses.failure)


def test_a_welcome_again_resends_the_replanned_shares_too() -> None:
    s, _ = sync_state(2)
    s.start_round()
    s.losses.departed(b"w1")
    actions = s.hello(b"w0", hello(slot=0, token="spawn-token", attempt=3))
    assert Send(b"w0", Collect(1, 2)) in actions
    assert isinstance(actions[0].message, Welcome)
