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

__all__ = ["STALE_POLICY_MESSAGE", "StalePolicyWatch"]

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


class StalePolicyWatch:
    """Warn once when ``policy`` changed but the workers' version did not.

    >>> from torch import nn
    >>> import torch, warnings
    >>> net = nn.Linear(2, 1)
    >>> watch = StalePolicyWatch(net, "MultiSyncCollector")
    >>> watch.check(0)                       # first batch: nothing changed
    >>> with torch.no_grad():
    ...     _ = net.weight.add_(1.0)         # an optimiser step, no update_policy_weights_()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     watch.check(0); watch.check(0)   # batches keep coming from version 0
    >>> len(caught), str(caught[0].message).startswith(STALE_POLICY_MESSAGE)
    (1, True)
    """

    def __init__(self, policy: nn.Module, collector: str) -> None:
        self._policy = policy
        self._collector = collector
        self._version: int | None = None  # the policy version the snapshot belongs to
        self._snapshot = 0
        self._warned = False

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
        if self._warned:
            return
        if version != self._version:  # started, or weights were sent: the workers have them
            self._version, self._snapshot = version, _written(self._policy)
            return
        if _written(self._policy) != self._snapshot:
            self._warned = True
            since = "the start" if version == 0 else f"version {version} was sent"
            warnings.warn(
                f"{STALE_POLICY_MESSAGE} since {since} (parameters or buffers written), but "
                f"the {self._collector}'s workers still step policy version {version}: "
                "TorchRL's CPU workers share the trainer's parameters live; asyncrl's see "
                "nothing until collector.update_policy_weights_() (await "
                "collector.update_policy_weights()). Call it after each optimiser step, or pass "
                "update_at_each_batch=True; if the old policy is what you want, silence this "
                f"with warnings.filterwarnings('ignore', message={STALE_POLICY_MESSAGE!r}).",
                UserWarning, stacklevel=5)  # the user's `async for`
