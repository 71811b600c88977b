"""``listen=`` is checked when the collector is made: a ValueError naming it (#35.4).

Before, a malformed address reached the hub's socket and came back from the
collector's start as a raw ``zmq.error.ZMQError`` ("Invalid argument").
"""

from __future__ import annotations

import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector


@pytest.mark.parametrize("collector", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize(("listen", "says"), [
    ("tcp://127.0.0.1", "has no port"),
    ("tcp://0.0.0.0:70000", "the port 70000, out of range"),
    ("http://0.0.0.0:5555", "the scheme 'http'"),
    ("0.0.0.0:5555", "has no scheme"),
])
def test_a_malformed_listen_address_is_a_value_error_naming_it(
        collector: type, listen: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        collector("CartPole-v1", None, num_workers=1, frames_per_batch=8, total_frames=8,
                  listen=listen)
    message = str(caught.value)
    assert message.startswith(f"listen={listen!r}") and says in message


@pytest.mark.parametrize("listen", ["tcp://127.0.0.1:0", "tcp://*:*", "tcp://0.0.0.0:5555"])
def test_listen_addresses_in_use_today_are_accepted(listen: str) -> None:
    collector = MultiSyncCollector("CartPole-v1", None, num_workers=1, frames_per_batch=8,
                                   total_frames=8, listen=listen)
    assert collector.listen == listen


@pytest.mark.parametrize(("listen", "says"), [
    ("tcp://127.0.0.1", "has no port"),
    ("http://0.0.0.0:5555", "the scheme 'http'"),
])
def test_the_batched_collector_names_a_malformed_listen_too(listen: str, says: str) -> None:
    from asyncrl import AsyncBatchedCollector

    with pytest.raises(ValueError) as caught:
        AsyncBatchedCollector("Pendulum-v1", frames_per_batch=8, total_frames=8, num_envs=1,
                              remote_workers=1, listen=listen)
    message = str(caught.value)
    assert message.startswith(f"listen={listen!r}") and says in message
