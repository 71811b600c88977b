"""The weight-sync exception tree.

``WeightSyncError`` is the root. Errors that travel back from a worker arrive
as :class:`transports.RemoteError` (with the worker's exception type and
traceback), not as these classes.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import AsyncRLError

__all__ = [
    "ModelPathError",
    "NotInitializedError",
    "WeightMismatchError",
    "WeightSyncError",
]

_SHOWN = 20  # keys listed per category before "... and N more"


class WeightSyncError(AsyncRLError):
    """Base class of the errors raised by :mod:`asyncrl.weights`."""


class NotInitializedError(WeightSyncError, RuntimeError):
    """A scheme was asked for its sender or receiver before ``init_on_*`` ran."""


class ModelPathError(WeightSyncError, LookupError):
    """A model id such as ``"env.transform[0]"`` does not resolve on the worker."""


class WeightMismatchError(WeightSyncError, ValueError):
    """Weights do not fit their destination: keys are missing, unexpected or mis-shaped
    (or of another dtype, where the bytes are copied as they are: Ray's flat buffer).

    Nothing was applied when this is raised.
    """

    def __init__(
        self,
        *,
        missing: Sequence[str] = (),
        unexpected: Sequence[str] = (),
        wrong_shape: Sequence[tuple[str, tuple[int, ...], tuple[int, ...]]] = (),
        wrong_dtype: Sequence[tuple[str, str, str]] = (),
        what: str = "weights",
    ) -> None:
        self.missing = sorted(missing)
        self.unexpected = sorted(unexpected)
        self.wrong_shape = sorted(wrong_shape)
        self.wrong_dtype = sorted(wrong_dtype)  #: ``(key, expected, got)`` dtype names
        parts = []
        if self.missing:
            parts.append(f"missing keys (in the destination, not in the {what}): "
                         + _listing(self.missing))
        if self.unexpected:
            parts.append(f"unexpected keys (in the {what}, not in the destination): "
                         + _listing(self.unexpected))
        if self.wrong_shape:
            shown = [f"{key} (expected {list(exp)}, got {list(got)})"
                     for key, exp, got in self.wrong_shape]
            parts.append("wrongly shaped keys: " + _listing(shown))
        if self.wrong_dtype:
            parts.append("keys of another dtype: " + _listing(
                [f"{key} (expected {exp}, got {got})" for key, exp, got in self.wrong_dtype]))
        super().__init__(
            f"{what} do not match the destination model; nothing was applied. "
            + "; ".join(parts)
            + ". Check that trainer and worker build the same architecture."
        )


def _listing(items: Sequence[str]) -> str:
    text = ", ".join(items[:_SHOWN])
    if len(items) > _SHOWN:
        text += f", ... and {len(items) - _SHOWN} more"
    return text
