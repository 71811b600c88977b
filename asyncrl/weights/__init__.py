"""Weight synchronisation from the trainer to its workers, per model id, with versions and acks.

On the trainer a :class:`WeightSender` per model id sends versioned updates
(``await sender.send()``, or ``send_async()`` then ``wait_ack()``); on each
worker a :class:`WeightReceiver` applies them at a step boundary and acks with
the version applied; a :class:`WeightApplier` drives a worker's receivers (apply
between steps, ack each update the way it came). A :class:`WeightSyncScheme`
decides how the bytes travel: :class:`ZmqWeightSyncScheme` (any host),
:class:`SharedMemWeightSyncScheme` (same host, zero-copy),
:class:`LiveSharedMemWeightSyncScheme` (same host, live: weaker),
:class:`CudaIpcWeightSyncScheme` (same host, GPU workers, zero-copy),
:class:`InProcessWeightSyncScheme` (collectors in the trainer's process) or
:class:`NoWeightSyncScheme`. See ``docs/weights.md``.
"""

from transports import LocalHub as LocalHub
from transports import LocalLink as LocalLink

from .._protocol import WEIGHTS_KIND as WEIGHTS_KIND
from ._applier import WeightApplier as WeightApplier
from ._cuda_ipc import CudaIpcWeightSyncScheme as CudaIpcWeightSyncScheme
from ._errors import ModelPathError as ModelPathError
from ._errors import NotInitializedError as NotInitializedError
from ._errors import WeightMismatchError as WeightMismatchError
from ._errors import WeightSyncError as WeightSyncError
from ._paths import resolve_model_path as resolve_model
from ._paths import resolve_model_path as resolve_model_path
from ._receiver import AckRoute as AckRoute
from ._receiver import WeightAck as WeightAck
from ._receiver import WeightReceiver as WeightReceiver
from ._receiver import WeightReceiverGroup as WeightReceiverGroup
from ._schemes import InProcessWeightSyncScheme as InProcessWeightSyncScheme
from ._schemes import LiveSharedMemWeightSyncScheme as LiveSharedMemWeightSyncScheme
from ._schemes import NoWeightSyncScheme as NoWeightSyncScheme
from ._schemes import SharedMemWeightSyncScheme as SharedMemWeightSyncScheme
from ._schemes import WeightSyncScheme as WeightSyncScheme
from ._schemes import ZmqWeightSyncScheme as ZmqWeightSyncScheme
from ._sender import WeightSender as WeightSender
from ._shared_memory import SharedMemWeightReceiver as SharedMemWeightReceiver
from ._shared_memory import SharedMemWeightSender as SharedMemWeightSender
from ._strategy import WeightStrategy as WeightStrategy

__all__ = [
    "WEIGHTS_KIND",
    "AckRoute",
    "CudaIpcWeightSyncScheme",
    "InProcessWeightSyncScheme",
    "LiveSharedMemWeightSyncScheme",
    "LocalHub",
    "LocalLink",
    "ModelPathError",
    "NoWeightSyncScheme",
    "NotInitializedError",
    "SharedMemWeightReceiver",
    "SharedMemWeightSender",
    "SharedMemWeightSyncScheme",
    "WeightAck",
    "WeightApplier",
    "WeightMismatchError",
    "WeightReceiver",
    "WeightReceiverGroup",
    "WeightSender",
    "WeightStrategy",
    "WeightSyncError",
    "WeightSyncScheme",
    "ZmqWeightSyncScheme",
    "resolve_model",
    "resolve_model_path",
]
