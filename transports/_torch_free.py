"""Whether this process runs without torch: ``ASYNCRL_TORCH_FREE=1`` in its environment.

An env worker of central inference steps envs and moves numpy arrays through
shared memory and ZeroMQ; torch and tensordict would cost it ~100 MB of its own
and seconds of import. In such a process ``import transports`` imports neither:
the codec sends its numpy arrays as tensors (its peer, a trainer, has torch) and
receives a tensor frame as a numpy array (a TensorDict or a dtype numpy lacks is
refused), and same-host blocks are attached as
:class:`~transports._shm_arrays.SharedArrayBlock`. ``SharedTensorFile`` is imported
only when asked for (it imports torch); ``SharedTensorBlock`` is there but needs torch.

Read once, at import: the process is torch-free or not for its whole life.
"""

from __future__ import annotations

import os

#: The environment variable, shared with asyncrl's spawn path (it sets it for its children).
VARIABLE = "ASYNCRL_TORCH_FREE"
TORCH_FREE = os.environ.get(VARIABLE) == "1"

__all__ = ["TORCH_FREE", "VARIABLE"]
