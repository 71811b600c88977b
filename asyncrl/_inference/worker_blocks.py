"""Each env worker's two blocks: its requests (observations) and the answers (outputs).

A local env worker and the inference loop share two shared-memory blocks
(:class:`transports.SharedTensorBlock`, made here by :func:`make_blocks`, unlinked by
the trainer): one slot per split of the worker's envs, where a request and its answer
alternate. The loop addresses a split as a *lane* (:func:`lane`); a remote env worker
has inline blocks instead (:class:`~asyncrl._inference.inline_blocks.InlineBlock`), one
lane.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from transports import SharedTensorBlock

from .outputs import OutputLayout

__all__ = ["MAX_SPLITS", "SPLIT_BITS", "WorkerBlocks", "lane", "make_blocks"]

Path = tuple[str, ...]

#: A lane is ``slot << SPLIT_BITS | split``: one split of a worker's envs (a block slot).
SPLIT_BITS = 8
MAX_SPLITS = 1 << SPLIT_BITS


def lane(slot: int, split: int = 0) -> int:
    """The lane of a worker's split (a remote worker asks on its split 0 only)."""
    return slot << SPLIT_BITS | split


@dataclass
class WorkerBlocks:
    """One env worker's request and response blocks, and its number of envs (``rows``).

    A block has one slot per split of the worker's envs, each of ``rows / splits`` rows.
    """

    rows: int
    obs: SharedTensorBlock
    act: SharedTensorBlock

    @property
    def splits(self) -> int:
        return int(getattr(self.obs, "slots", 1))

    def close(self) -> None:
        for block in (self.obs, self.act):
            block.close()
            block.unlink()


def make_blocks(rows_per_worker: Sequence[int], obs: dict[Path, torch.Tensor],
                outputs: OutputLayout, splits: int = 1) -> dict[int, WorkerBlocks]:
    """Create each worker's two blocks: one slot per split of its envs (``rows / splits``
    rows each), where a request and its answer alternate."""
    blocks: dict[int, WorkerBlocks] = {}
    try:
        for slot, rows in enumerate(rows_per_worker):
            if splits > MAX_SPLITS:
                raise ValueError(f"{splits} splits: a lane has room for {MAX_SPLITS}")
            if rows % splits:
                raise ValueError(f"{rows} envs do not split in {splits} equal parts")
            per_split = rows // splits
            example = {f"o{i}": torch.zeros((per_split, *t.shape[1:]), dtype=t.dtype)
                       for i, t in enumerate(obs.values())}
            obs_block = SharedTensorBlock.create(example, slots=splits)
            try:
                act_block = SharedTensorBlock.create(outputs.block_tensors(per_split),
                                                     slots=splits)
            except BaseException:
                obs_block.close()
                obs_block.unlink()
                raise
            blocks[slot] = WorkerBlocks(rows, obs_block, act_block)
    except BaseException:
        for b in blocks.values():
            b.close()
        raise
    return blocks
