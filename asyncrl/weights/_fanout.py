"""Weights sent once to a host's relay, which fans them out to that host's workers.

The sender names the members in the message's :class:`~asyncrl._protocol.WeightMeta`
(``relay_to``). The relay acks with a :class:`~asyncrl._protocol.RelayAck`: the
version each member applied and, for the others, why not.
:func:`parse_relay_ack` reads that answer on the trainer, as hostile input:
anything malformed counts as a failure of every member, never a crash.
"""

from __future__ import annotations

from typing import Any

from transports import PeerLostError, ProtocolError, RemoteError

from .._protocol import RELAY_TO, RelayAck

__all__ = ["RELAY_TO", "parse_relay_ack"]


def parse_relay_ack(result: Any, members: dict[bytes, int], relay: bytes, sent: int,
                    latest: int) -> tuple[dict[int, int], dict[int, BaseException]]:
    """Read a relay's ack: ``({worker_id: version}, {worker_id: error})`` over ``members``.

    ``members`` maps each member identity the message was relayed to onto its
    worker id. A member the answer does not account for, or one that claims a
    version outside ``sent..latest`` (newest wins: a worker may ack version
    ``sent`` with a newer one it applied), is a failure, so a faulty relay cannot
    make ``wait_ack`` report an update nobody applied.
    """
    via = relay.decode(errors="replace")
    try:
        ack = RelayAck.from_body(result)
    except ProtocolError as exc:
        ack, why = RelayAck("", {}), f"; its ack is malformed: {exc}"
    else:
        why = ""
    applied: dict[int, int] = {}
    errors: dict[int, BaseException] = {}
    for member, worker_id in members.items():
        version = ack.versions.get(member)
        if version is not None and sent <= version <= latest:
            applied[worker_id] = version
        elif member in ack.failed:
            errors[worker_id] = _failure_error(member, ack, via)
        else:
            errors[worker_id] = RemoteError(
                f"relay {via} acknowledged without a valid version for this worker "
                f"(got {version!r}); expected an int in {sent}..{latest}{why}",
                peer=member, remote_type="asyncrl.weights.RelayProtocolError")
    return applied, errors


def _failure_error(member: bytes, ack: RelayAck, via: str) -> BaseException:
    failure = ack.failed[member]
    if failure.type == RelayAck.LOST_TYPE:
        return PeerLostError([member], f"(relay {via}: {failure.message})")
    error = failure.to_remote_error(member)
    error.add_note(f"reported by relay {via}")
    return error
