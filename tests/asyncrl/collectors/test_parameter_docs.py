"""The collectors' Parameters sections come from one table: shared words stay shared."""

from __future__ import annotations

import inspect
import textwrap

import pytest

from asyncrl import Collector, MultiAsyncCollector, MultiCollector, MultiSyncCollector
from asyncrl.collectors._parameters import SHARED, parameters_section


@pytest.mark.parametrize("cls", [Collector, MultiCollector, MultiSyncCollector,
                                 MultiAsyncCollector], ids=lambda c: c.__name__)
def test_every_shared_description_is_in_each_collectors_help_word_for_word(cls: type) -> None:
    section = (inspect.getdoc(cls) or "").split("Parameters\n----------\n", 1)[1]
    for heading, description in SHARED.items():
        entry = f"{heading}\n{textwrap.indent(description, '    ')}\n"
        assert entry in section, f"{cls.__name__}: {heading!r} is not SHARED's text"


def test_a_heading_without_text_must_be_a_shared_one() -> None:
    assert parameters_section("total_frames\n") == (
        "Parameters\n----------\ntotal_frames\n    " + SHARED["total_frames"])
    with pytest.raises(ValueError, match="'num_wrokers' has no description here nor in SHARED"):
        parameters_section("num_wrokers\n")
