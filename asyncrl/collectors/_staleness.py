"""`StalePolicyWatch`: one warning when the trainer trains a policy its workers never get.

TorchRL's CPU workers share the trainer's parameters, so an optimiser step
reaches them live; asyncrl's workers hold a copy and see nothing until
``update_policy_weights_()``. A ported loop without that call collects its
whole run with the first policy. Before each batch is asked for, the watch
compares the trainer's module with how it was when the workers last got its
weights (at the start, or at the last update: the ``"policy"`` version moved):
every parameter and buffer written in place since (an optimiser step, a
``load_state_dict``, an annealed buffer) bumps its tensor's ``_version``
counter, so the check is a sum of integers, no tensor read. (Writes through
``.data`` bypass that counter and go unseen: a missed warning, never a false one.)
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

__all__ = ["PATIENCE", "STALE_POLICY_MESSAGE", "StalePolicyWatch"]

#: The start of the warning's text (``warnings.filterwarnings("ignore", message=...)``).
STALE_POLICY_MESSAGE = "asyncrl: the trainer's policy changed"


def _written(module: nn.Module) -> int:
    """How many in-place writes the module's tensors have seen (a cheap fingerprint)."""
    total = 0
    for param in module.parameters():
        total += param._version
    for buffer in module.buffers():
        total += buffer._version
    return total


#: Batches in a row from the first policy, changed meanwhile, before the warning: a
#: trainer that sends every few batches (examples/service.py: every 4) is not warned.
PATIENCE = 10


class StalePolicyWatch:
    """Warn once when ``policy`` keeps changing and its workers never got a version.

    The ported loop that forgot ``update_policy_weights_()`` is the one warned: its
    ``"policy"`` version never moves from the start while the module is trained,
    :data:`PATIENCE` batches in a row. A trainer that sent weights even once knows the
    call and chooses its own pace (every k batches): it is never warned.

    >>> from torch import nn
    >>> import torch, warnings
    >>> net = nn.Linear(2, 1)
    >>> watch = StalePolicyWatch(net, "MultiSyncCollector")
    >>> watch.check(0)                       # first batch: nothing changed
    >>> with torch.no_grad():
    ...     _ = net.weight.add_(1.0)         # an optimiser step, no update_policy_weights_()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     for _ in range(2 * PATIENCE):
    ...         watch.check(0)               # batches keep coming from version 0
    >>> len(caught), str(caught[0].message).startswith(STALE_POLICY_MESSAGE)
    (1, True)
    """

    def __init__(self, policy: nn.Module, collector: str) -> None:
        self._policy = policy
        self._collector = collector
        self._version: int | None = None  # the version when the watch started
        self._snapshot = 0
        self._stale = 0  # batches asked for since the policy first changed
        self._done = False

    @classmethod
    def for_collector(cls, policy: Any, schemes: dict[str, Any] | None,
                      collector: str) -> StalePolicyWatch | None:
        """A watch for a module the workers copy; None where they see it live or there is
        nothing to watch (no module, live shared memory)."""
        from ..weights import LiveSharedMemWeightSyncScheme

        if not isinstance(policy, nn.Module):
            return None
        scheme = (schemes or {}).get("policy")
        if scheme is None or isinstance(scheme, LiveSharedMemWeightSyncScheme):
            return None
        return cls(policy, collector)

    def check(self, version: int) -> None:
        """Before a batch is asked for; ``version`` is the latest ``"policy"`` version sent."""
        if self._done:
            return
        if self._version is None:  # the first batch: what the workers start with
            self._version, self._snapshot = version, _written(self._policy)
            return
        if version != self._version:  # weights were sent: this trainer updates its workers
            self._done = True
            return
        if self._stale == 0 and _written(self._policy) == self._snapshot:
            return  # not trained (yet): collecting with the first policy is right
        self._stale += 1
        if self._stale < PATIENCE:
            return
        self._done = True
        warnings.warn(
            f"{STALE_POLICY_MESSAGE} since the start (parameters or buffers written), but "
            f"after {PATIENCE} more batches the {self._collector}'s workers still step policy "
            f"version {version}: TorchRL's CPU workers share the trainer's parameters live; "
            "asyncrl's see nothing until collector.update_policy_weights_() (await "
            "collector.update_policy_weights()). Call it after each optimiser step, or pass "
            "update_at_each_batch=True; if the old policy is what you want, silence this "
            f"with warnings.filterwarnings('ignore', message={STALE_POLICY_MESSAGE!r}).",
            UserWarning, stacklevel=5)  # the user's `async for`
