"""Env factories that log in the worker process (module-level: workers import them)."""

from __future__ import annotations

import logging
import os
from typing import Any

import gymnasium as gym

log = logging.getLogger("user.env")


def make_logging_env() -> Any:
    """CartPole, after a WARNING and an ERROR with a traceback from the worker's process."""
    log.warning("env built in pid %d", os.getpid())
    try:
        raise ValueError("a handled failure")
    except ValueError:
        log.exception("env saw a traceback")
    return gym.make("CartPole-v1")


def make_logging_counting_env() -> Any:
    """``asyncrl.testing.CountingEnv``, after a WARNING from its process (a remote env host's)."""
    from asyncrl.testing import CountingEnv

    log.warning("counting env built in pid %d", os.getpid())
    return CountingEnv()
