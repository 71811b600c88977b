"""Seeding a collecting process's global RNGs, as TorchRL's workers do.

A stochastic policy samples from torch's (or numpy's) global generator, not
from the env's: ``set_seed`` must seed those too for two runs to repeat. Each
worker is given its own seed (the previous worker's next free seed), so
workers do not draw the same noise.

>>> import torch
>>> seed_global_rngs(7); a = torch.rand(2)
>>> seed_global_rngs(7); bool(torch.equal(a, torch.rand(2)))
True
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["seed_global_rngs"]


def seed_global_rngs(seed: int) -> None:
    """Seed torch's and numpy's global RNGs with ``seed`` (numpy's modulo 2**32)."""
    torch.manual_seed(seed)
    np.random.seed(seed % (1 << 32))
