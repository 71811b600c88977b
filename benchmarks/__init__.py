"""asyncrl's benchmarks: run from a source checkout, not installed with the package.

``python -m benchmarks.NAME --help`` from the repository root (or ``asyncrl bench
NAME`` there); each prints a Markdown table and the command that made it. They use
asyncrl's public faces (``asyncrl``, ``asyncrl.weights``, ``asyncrl.testing``,
``transports``) and TorchRL; the few that time an internal part on its own say so
in their imports (``scaling``, ``scaling_host``, ``relay``, ``profile_worker``).

    codec           transports' codec against pickle and torch.save
    channels        Hub/Link round trips and throughput against bare pyzmq
    weights         weight sync latency, bandwidth and memory against TorchRL's schemes
    collect         collection frames/s, first batch and worker memory against TorchRL
    atari           real Atari (Breakout, 8 envs) against EnvPool, gymnasium, PufferLib, TorchRL
    profile_worker  where a worker's time per env step goes
    scaling         the coordinator with up to 512 simulated workers
    relay           weights once per host through a relay; one hop more for batches
    torchrl_faults  what TorchRL's collectors do under the chaos suite's faults
    mlp_before_after  asyncrl's frames/s on a small MLP policy (before/after a change)
"""

from __future__ import annotations

import os

#: The repository root: child processes started with ``python -m benchmarks.X`` run there,
#: so that they import these benchmarks (and the asyncrl beside them) from any directory.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
