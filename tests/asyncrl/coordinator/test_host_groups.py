"""A host's workers are admitted together or not at all (no half-admitted hosts).

Two 2-worker hosts racing for two free places: the first worker admitted holds
its sibling's place, so the other host's workers are refused (as full: they ask
again), and neither host ends half admitted. A hold is bounded; a host larger
than the run is refused for good; a hello's group fields are hostile input.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncrl._coordinator.host_groups import HOLD, QUIET, HostGroups
from asyncrl._coordinator.state import CoordinatorState
from asyncrl._protocol import Hello, Refuse, Welcome
from transports import ProtocolError

from .test_coordinator_state import hello, state


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def grouped(group: str, pid: int, size: int = 2, attempt: int = 0) -> Hello:
    return replace(hello(pid=pid, attempt=attempt), group=group, group_size=size)


def answer(s: CoordinatorState, peer: bytes, message: Hello) -> Welcome | Refuse:
    first = s.hello(peer, message)[0].message
    assert isinstance(first, Welcome | Refuse), first
    return first


def run(places: int, clock: Clock | None = None) -> CoordinatorState:
    s = state(max_remote_workers=places)
    s.admission.groups = HostGroups(clock=clock or Clock())
    return s


def test_two_hosts_racing_for_two_places_one_joins_whole_the_other_is_refused_whole() -> None:
    s = run(2)
    # Interleaved as a race makes them: a0, b0, a1, b1.
    assert isinstance(answer(s, b"a0", grouped("A", 1)), Welcome)
    b0 = answer(s, b"b0", grouped("B", 2))
    assert isinstance(answer(s, b"a1", grouped("A", 1)), Welcome)
    b1 = answer(s, b"b1", grouped("B", 2))
    assert isinstance(b0, Refuse) and isinstance(b1, Refuse)
    assert b0.full and b1.full  # they may ask again: a place may free
    assert "at most 2 remote worker(s) and 1 already joined and 1 place(s) are held for " \
           "the workers of hosts joining now" in b0.reason
    assert "this host's 2 workers still to join need 2 free places at once (a host joins " \
           "whole or not at all), and 0 are free" in b0.reason
    assert sorted(w.group for w in s.roster.live_workers) == ["A", "A"]


def test_a_host_refused_whole_joins_whole_once_its_places_are_free() -> None:
    s = run(2)
    for peer in (b"a0", b"a1"):
        answer(s, peer, grouped("A", 1))
    assert isinstance(answer(s, b"b0", grouped("B", 2)), Refuse)
    s.losses.departed(b"a0")  # one place free: still not enough for B's two
    assert isinstance(answer(s, b"b0", grouped("B", 2, attempt=1)), Refuse)
    s.losses.departed(b"a1")
    assert isinstance(answer(s, b"b1", grouped("B", 2, attempt=1)), Welcome)
    # A stranger cannot take the place held for b0 meanwhile ...
    stranger = answer(s, b"x", hello(pid=3))
    assert isinstance(stranger, Refuse) and stranger.full
    # ... and b0 takes it.
    assert isinstance(answer(s, b"b0", grouped("B", 2, attempt=2)), Welcome)
    assert sorted(w.group for w in s.roster.live_workers) == ["B", "B"]


def test_a_held_place_is_freed_after_the_hold_when_the_sibling_never_comes() -> None:
    clock = Clock()
    s = run(2, clock)
    answer(s, b"a0", grouped("A", 1))
    assert isinstance(answer(s, b"x", hello(pid=3)), Refuse)
    clock.now = HOLD + 0.1  # a1's process died while it built its envs
    assert isinstance(answer(s, b"x", hello(pid=3, attempt=1)), Welcome)


def test_a_host_that_lost_one_worker_needs_one_place_to_make_it_whole_again() -> None:
    s = run(3)
    for peer in (b"a0", b"a1"):
        answer(s, peer, grouped("A", 1))
    answer(s, b"x", hello(pid=3))  # the third place
    s.losses.lost(b"a1", "silent")
    assert isinstance(answer(s, b"a1", grouped("A", 1, attempt=1)), Welcome)


def test_a_host_larger_than_the_run_is_refused_for_good_naming_both_sizes() -> None:
    s = run(2)
    refused = answer(s, b"a0", grouped("A", 1, size=3))
    assert isinstance(refused, Refuse) and not refused.full
    assert "this host brings 3 workers and this collector takes at most 2 remote worker(s); " \
           "start the host with --workers 2 or fewer" in refused.reason


def test_without_a_limit_nothing_is_held_and_ungrouped_workers_join_as_before() -> None:
    s = state()  # remote_workers unbounded
    for index, peer in enumerate((b"a0", b"b0", b"c")):
        message = grouped(chr(65 + index), 1) if index < 2 else hello(pid=3)
        assert isinstance(answer(s, peer, message), Welcome)
    assert s.admission.groups.held() == 0


@pytest.mark.parametrize("fields, error", [
    ({"group": "A", "group_size": 0}, "group_size must be 1 to 1024 with a group"),
    ({"group": "", "group_size": 2}, "group_size must be 1 to 1024 with a group"),
    ({"group": "A", "group_size": 5000}, "group_size must be 1 to 1024"),
    ({"group": "A", "group_size": True}, "'group_size' must be int"),
    ({"group": 7, "group_size": 2}, "'group'"),
])
def test_a_hellos_group_fields_are_validated(fields: dict, error: str) -> None:
    body = {**hello().to_body(), **fields}
    with pytest.raises(ProtocolError, match=error):
        Hello.from_body(body)


def test_a_hello_without_group_fields_from_an_older_worker_is_ungrouped() -> None:
    body = hello().to_body()
    del body["group"], body["group_size"]
    parsed = Hello.from_body(body)
    assert (parsed.group, parsed.group_size) == ("", 0)
    long = Hello.from_body({**body, "group": "\x1b" * 500, "group_size": 2}).group
    assert len(long) <= 64 and "\x1b" not in long  # bounded and printable


# -- a hold cannot be kept by a stranger (issue #43, attack 4) --------------------------------
def honest_host_joins(s: CoordinatorState, attempt: int = 0) -> bool:
    """Both workers of the 2-worker host "H" ask; True once both are welcomed."""
    first = answer(s, b"h0", grouped("H", 10, attempt=attempt))
    second = answer(s, b"h1", grouped("H", 10, attempt=attempt))
    return isinstance(first, Welcome) and isinstance(second, Welcome)


@pytest.mark.parametrize("leaves", ["departed", "lost", "stalled"])
def test_a_stranger_whose_only_worker_leaves_holds_no_place(leaves: str) -> None:
    s = run(4)  # the attack: remote_workers=4, no keys, one hello saying group_size=4
    assert isinstance(answer(s, b"x", grouped("X", 66, size=4)), Welcome)
    assert s.admission.groups.held() == 3
    getattr(s.losses, leaves)(b"x", *(("silent",) if leaves == "lost" else
                               (61.0,) if leaves == "stalled" else ()))
    assert honest_host_joins(s)  # at once: nothing is held for a group with nobody left
    assert s.admission.groups.held() == 0
    assert sorted(w.group for w in s.roster.live_workers) == ["H", "H"]


def test_a_group_that_never_fills_frees_its_places_within_the_hold() -> None:
    clock = Clock()
    s = run(4, clock)
    answer(s, b"x", grouped("X", 66, size=4))  # stays, and its siblings never come
    refused = answer(s, b"h0", grouped("H", 10))
    assert isinstance(refused, Refuse) and refused.full  # it asks again
    clock.now = HOLD + 0.1
    assert honest_host_joins(s, attempt=1)


def test_a_refused_host_is_admitted_before_it_stops_asking() -> None:
    from asyncrl._worker.join import JOIN_BACKOFF_MAX
    from asyncrl.cli import build_parser

    join_timeout = build_parser().parse_args(
        ["worker", "--connect", "tcp://h:1", "--env", "CartPole-v1"]).join_timeout
    longest_pause = 1.25 * JOIN_BACKOFF_MAX  # between two hellos of a host refused as full
    assert QUIET > longest_pause  # it asks while no new hold can shut it out
    assert HOLD + QUIET < join_timeout  # the bound docs/multihost.md names: 42 s < 60 s


def test_a_group_cannot_renew_a_hold_it_lost() -> None:
    clock = Clock()
    s = run(4, clock)
    answer(s, b"x", grouped("X", 66, size=4))
    clock.now = HOLD + 0.1  # expired: X's worker is still there, nothing is held
    assert s.admission.groups.held() == 0
    # Another hello of X: a worker of its own (a place), but no hold for siblings again.
    assert isinstance(answer(s, b"x2", grouped("X", 67, size=4)), Welcome)
    assert s.admission.groups.held() == 0
    assert honest_host_joins(s)


def test_a_group_whose_workers_left_cannot_hold_again_by_saying_hello_again() -> None:
    s = run(4)
    answer(s, b"x", grouped("X", 66, size=4))
    s.losses.departed(b"x")
    for attempt, peer in enumerate((b"x", b"x2", b"x3"), start=1):  # again and again
        assert isinstance(answer(s, peer, grouped("X", 66 + attempt, size=4, attempt=attempt)),
                          Welcome)
        s.losses.departed(peer)
        assert s.admission.groups.held() == 0
    assert honest_host_joins(s)


@pytest.mark.parametrize("seed", range(20))
def test_whatever_hellos_a_stranger_sends_an_honest_host_joins_within_the_hold(
        seed: int) -> None:
    """A stranger sends hellos of every group shape (fresh names too), its workers
    leaving or staying; the honest 2-worker host asks every 10 s (its longest pause) and
    is admitted within HOLD + QUIET. (Workers that stay take places, as any worker does
    without keys: the stranger here keeps one at a time.)"""
    import random

    rng = random.Random(seed)
    clock = Clock()
    s = run(4, clock)
    stranger: bytes | None = None
    joined_at = None
    for tick in range(int(HOLD + QUIET + 10) * 4):  # every 0.25 s
        clock.now = tick / 4
        if stranger is not None and rng.random() < 0.3:
            getattr(s.losses, rng.choice(["departed", "lost"]))(stranger)
            stranger = None
        if stranger is None:
            peer = f"x{tick}".encode()
            group = rng.choice(["X", "Y", f"fresh-{tick}"])
            message = grouped(group, 1000 + tick, size=rng.randint(1, 4), attempt=tick)
            if isinstance(answer(s, peer, message), Welcome):
                stranger = peer
        if tick % 40 == 1 and honest_host_joins(s, attempt=tick):
            joined_at = clock.now
            break
    assert joined_at is not None and joined_at <= HOLD + QUIET, (seed, joined_at)
