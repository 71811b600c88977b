"""The served module's errors, in asyncrl's tree (:class:`~asyncrl.AsyncRLError`)."""

from __future__ import annotations

from .._errors import AsyncRLError

__all__ = ["ServedModuleError", "ServedModuleTimeout", "UnknownModelError"]


class ServedModuleError(AsyncRLError):
    """A call to a served module failed: the module raised, it was closed, or no slot was free.

    Raised in the env's step (the process that called), so the collector reports it as
    that worker's error, with this message.
    """


class ServedModuleTimeout(ServedModuleError, TimeoutError):
    """A served module did not answer a call within its ``call_timeout``."""


class UnknownModelError(KeyError, ValueError):
    """``update_policy_weights(model_id=...)`` named no model this collector updates.

    A ``KeyError``, as TorchRL and the in-process ``Collector`` raised for an unknown
    model id, and a ``ValueError``, as ``AsyncBatchedCollector`` raised: code that
    catches either keeps working. Its text is the message, not a quoted key.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
