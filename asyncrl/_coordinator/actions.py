"""What a coordinator state change asks for: the sends, expulsions and catch-ups to perform.

Each method of :class:`~asyncrl._coordinator.state.CoordinatorState` returns these,
in order; :class:`~asyncrl._coordinator.coordinator.Coordinator` performs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._protocol import Collect, Preempt, Refuse, Rejoin, RelayWelcome, Welcome
from .records import WorkerInfo

#: What the coordinator sends a worker or a relay (everything else it sends is weights).
Outbound = Welcome | Refuse | Rejoin | RelayWelcome | Collect | Preempt


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` to ``peer`` with ``kind=message.KIND``.

    ``worker`` is the admission an order (welcome, collect, preempt) is for: the
    order is dropped if that worker was lost before it went out. It is left out
    of comparisons, so that a test says which message goes to which peer. The
    hub admits ``peer`` before a welcome (its first batch may be large) and
    expels it after a refusal (a stranger again: small messages only).
    """

    peer: bytes
    message: Outbound
    worker: WorkerInfo | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Expel:
    """``peer`` (a lost or replaced worker) is a stranger to the hub again: the acks it
    owes are abandoned at once (a weight send does not wait for a dead process's
    heartbeats to stop), and if it speaks again the hub says so (``"returned"``)."""

    peer: bytes


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Send ``worker`` the latest weights, ahead of its first order (skipped if lost)."""

    worker: WorkerInfo


Action = Send | Expel | CatchUp


__all__ = ["Action", "CatchUp", "Expel", "Outbound", "Send"]
