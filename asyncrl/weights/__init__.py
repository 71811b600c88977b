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
:class:`DistributedWeightSyncScheme` (torch.distributed broadcast: GPU workers, many hosts),
:class:`RayWeightSyncScheme` (Ray's object store: workers Ray started),
:class:`InProcessWeightSyncScheme` (collectors in the trainer's process) or
:class:`NoWeightSyncScheme`, each in a module of its own with its sender and
receiver. See ``docs/weights.md``; ``transports.LocalHub`` / ``LocalLink`` carry
weights in memory (tests, in-process collectors).
"""

from .._protocol import WEIGHTS_KIND as WEIGHTS_KIND
from ._applier import WeightApplier as WeightApplier
from ._cuda_ipc import CudaIpcWeightSyncScheme as CudaIpcWeightSyncScheme
from ._distributed import DistributedWeightReceiver as DistributedWeightReceiver
from ._distributed import DistributedWeightSender as DistributedWeightSender
from ._distributed import DistributedWeightSyncScheme as DistributedWeightSyncScheme
from ._errors import ModelPathError as ModelPathError
from ._errors import NotInitializedError as NotInitializedError
from ._errors import WeightMismatchError as WeightMismatchError
from ._errors import WeightSyncError as WeightSyncError
from ._in_process import InProcessWeightSyncScheme as InProcessWeightSyncScheme
from ._live_shared_memory import LiveSharedMemWeightSyncScheme as LiveSharedMemWeightSyncScheme
from ._no_weights import NoWeightSyncScheme as NoWeightSyncScheme
from ._paths import resolve_model_path as resolve_model_path
from ._ray import RayWeightReceiver as RayWeightReceiver
from ._ray import RayWeightSender as RayWeightSender
from ._ray import RayWeightSyncScheme as RayWeightSyncScheme
from ._ray_updater import RayWeightUpdater as RayWeightUpdater
from ._receiver import AckRoute as AckRoute
from ._receiver import WeightAck as WeightAck
from ._receiver import WeightReceiver as WeightReceiver
from ._receiver import WeightReceiverGroup as WeightReceiverGroup
from ._scheme import WeightSyncScheme as WeightSyncScheme
from ._sender import WeightSender as WeightSender
from ._shared_memory import SharedMemWeightReceiver as SharedMemWeightReceiver
from ._shared_memory import SharedMemWeightSender as SharedMemWeightSender
from ._shared_memory import SharedMemWeightSyncScheme as SharedMemWeightSyncScheme
from ._strategy import WeightStrategy as WeightStrategy
from ._zmq import StreamedWeightReceiver as StreamedWeightReceiver
from ._zmq import StreamingWeightSender as StreamingWeightSender
from ._zmq import ZmqWeightSyncScheme as ZmqWeightSyncScheme

__all__ = [
    "WEIGHTS_KIND",
    "AckRoute",
    "CudaIpcWeightSyncScheme",
    "DistributedWeightReceiver",
    "DistributedWeightSender",
    "DistributedWeightSyncScheme",
    "InProcessWeightSyncScheme",
    "LiveSharedMemWeightSyncScheme",
    "ModelPathError",
    "NoWeightSyncScheme",
    "NotInitializedError",
    "RayWeightReceiver",
    "RayWeightSender",
    "RayWeightSyncScheme",
    "RayWeightUpdater",
    "SharedMemWeightReceiver",
    "SharedMemWeightSender",
    "SharedMemWeightSyncScheme",
    "StreamedWeightReceiver",
    "StreamingWeightSender",
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
    "resolve_model_path",
]
