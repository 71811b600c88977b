"""The coordinator's two inputs built from one set of test options.

A test says what it varies (``sync=True, on_worker_loss="wait", token=...``);
:func:`rules` puts each option where the coordinator reads it: the run's
:class:`CoordinatorConfig` (``on_worker_loss`` becomes its ``loss_policy``) or the
:class:`AdmissionTerms` known once the run opened. An unknown name is a TypeError.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from asyncrl._coordinator.admission import AdmissionTerms
from asyncrl._coordinator.config import CoordinatorConfig
from asyncrl._coordinator.loss_policy import LossPolicy

_CONFIG = {f.name for f in fields(CoordinatorConfig)}
_TERMS = {f.name for f in fields(AdmissionTerms)}


def rules(**options: Any) -> tuple[CoordinatorConfig, AdmissionTerms]:
    """``(config, terms)`` from ``options`` (``sync`` defaults to False, shares to [8])."""
    if "on_worker_loss" in options:
        options["loss_policy"] = LossPolicy.check(options.pop("on_worker_loss"))
    unknown = set(options) - _CONFIG - _TERMS
    if unknown:
        raise TypeError(f"not a coordinator option: {sorted(unknown)}")
    config = {"sync": False, "share_frames": [8],
              **{k: v for k, v in options.items() if k in _CONFIG}}
    return (CoordinatorConfig(**config),
            AdmissionTerms(**{k: v for k, v in options.items() if k in _TERMS}))


def run_config(**options: Any) -> CoordinatorConfig:
    """The :class:`CoordinatorConfig` of ``options`` (no admission terms among them)."""
    config, terms = rules(**options)
    assert terms == AdmissionTerms(), f"admission terms given to run_config: {terms}"
    return config


def shm_config(**options: Any) -> CoordinatorConfig:
    """:func:`run_config` with local workers' batches through shared memory."""
    return run_config(shared_memory_batches=True, **options)
