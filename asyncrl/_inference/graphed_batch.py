"""A policy call replayed from one CUDA graph of a fixed batch size (``static_batch_size``).

TorchRL's ``InferenceServerConfig(static_batch_size=S)``: the served policy is
captured once in a CUDA graph of ``S`` rows, and every call copies its ``n <= S``
rows into the graph's input buffers, replays the graph and copies the first ``n``
rows of its outputs out. Rows ``n..S`` hold earlier calls' observations (zeros at
first); their outputs are discarded. A replay is one launch where an eager call
is one per kernel plus the Python of every module: what a small, wide policy
costs per call on a GPU.

The graph reads the policy's parameters where they are: updates must copy into
them (every weight path of the central collector does: ``load_state_dict`` and
``TensorDict.update_``), and are seen by the next replay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from .._errors import CollectorError

__all__ = ["CaptureError", "GraphedDeviceBatch"]

#: Eager calls on a side stream before the capture (cuDNN / cuBLAS workspaces, lazy
#: modules): the warm-up PyTorch's CUDA-graph notes ask for.
WARMUP_CALLS = 3


class CaptureError(CollectorError, RuntimeError):
    """The policy could not be captured in a CUDA graph (it syncs, or leaves the device).

    A :class:`~asyncrl.CollectorError` (asyncrl's tree), and a ``RuntimeError`` as before.
    """


def capture_cuda_graph(run: Callable[[], list[torch.Tensor]],
                       device: torch.device) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """Warm ``run`` up on a side stream, capture it; ``(replay, its static outputs)``."""
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    current = torch.cuda.current_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            run()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: the trainer's own CUDA work (the thread server shares its process)
    # goes on during the capture instead of failing it.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = run()
    return graph.replay, outputs


class GraphedDeviceBatch:
    """``call(n, policy, keys) -> host outputs``, as :class:`DeviceBatch`, from one CUDA graph.

    ``host`` maps the batch's keys to the loop's pinned gather tensors of
    ``capacity`` rows; the graph has ``static`` rows (``>= capacity``). The graph
    is captured at the first call (its inputs are that call's rows). ``capture``
    is the capturing function (tests pass an eager stand-in on the CPU).

    >>> import torch
    >>> host = {"observation": torch.ones(4, 3)}
    >>> def eager(run, device):   # a stand-in for the CUDA capture: replays eagerly
    ...     outs = run()
    ...     return (lambda: [o.copy_(n) for o, n in zip(outs, run())]), outs
    >>> call = GraphedDeviceBatch(host, torch.device("cpu"), capacity=4, static=8,
    ...                           capture=eager)
    >>> call(2, lambda td: td.set("action", td["observation"].sum(-1)), ["action"])[0].tolist()
    [3.0, 3.0]
    """

    def __init__(self, host: Mapping[Any, torch.Tensor], device: torch.device, *,
                 capacity: int, static: int,
                 capture: Callable[..., tuple[Callable[[], Any], list[torch.Tensor]]]
                 = capture_cuda_graph) -> None:
        if static < capacity:
            raise ValueError(f"static_batch_size={static} is smaller than max_batch_size="
                             f"{capacity}: a call of max_batch_size rows must fit the graph")
        self.device = device
        self.capacity = capacity
        self.static = static
        self._capture = capture
        self._pairs = [(torch.zeros((static, *t.shape[1:]), dtype=t.dtype, device=device), t)
                       for t in host.values()]
        self._td = TensorDict({key: dev for key, (dev, _) in zip(host, self._pairs, strict=True)},
                              batch_size=[static], device=device)
        self._pin = device.type == "cuda"
        self._replay: Callable[[], Any] | None = None
        self._static_outputs: list[torch.Tensor] = []
        self._host_outputs: list[torch.Tensor] = []
        self._keys: list[Any] = []
        self._stream: Any = None
        self.captures = 0  #: graphs captured (one, unless the output keys change)

    def __call__(self, n: int, policy: Callable[[TensorDictBase], Any],
                 keys: Sequence[Any]) -> list[torch.Tensor]:
        for dev, host in self._pairs:
            dev[:n].copy_(host[:n], non_blocking=True)
        if self._replay is None or list(keys) != self._keys:
            self._capture_policy(policy, keys)
        assert self._replay is not None
        self._replay()
        results = []
        for value, buffer in zip(self._static_outputs, self._host_outputs, strict=True):
            buffer[:n].copy_(value[:n], non_blocking=True)
            results.append(buffer[:n])
        if self._pin:
            if self._stream is None:
                self._stream = torch.cuda.current_stream(self.device)
            self._stream.synchronize()  # one wait: the replay and every copy
        return results

    def _capture_policy(self, policy: Callable[[TensorDictBase], Any],
                        keys: Sequence[Any]) -> None:
        wanted = list(keys)

        def run() -> list[torch.Tensor]:
            td = self._td.copy()  # shallow: what the policy sets stays out of the inputs
            out = policy(td)
            td = td if out is None else out
            return [td.get(key) for key in wanted]

        try:
            replay, outputs = self._capture(run, self.device)
        except Exception as exc:
            why = str(exc).splitlines()[0][:300] if str(exc) else ""
            raise CaptureError(
                f"static_batch_size={self.static}: the policy could not be captured in a "
                f"CUDA graph ({type(exc).__name__}: {why}). "
                "A graphed policy may not synchronise with the host (.item(), .cpu(), "
                "data-dependent Python branches) nor allocate outside the graph; leave "
                "static_batch_size out to serve it eagerly") from exc
        for key, value in zip(wanted, outputs, strict=True):
            if not isinstance(value, torch.Tensor) or value.device.type != self.device.type \
                    or value.shape[:1] != (self.static,):
                got = (f"{tuple(value.shape)} on {value.device}"
                       if isinstance(value, torch.Tensor) else type(value).__name__)
                raise CaptureError(
                    f"static_batch_size={self.static}: the graphed policy's {key!r} must be a "
                    f"tensor of {self.static} rows on {self.device}, got {got}")
        self._replay, self._static_outputs, self._keys = replay, outputs, wanted
        self._host_outputs = [torch.empty((self.capacity, *v.shape[1:]), dtype=v.dtype,
                                          pin_memory=self._pin) for v in outputs]
        self.captures += 1
