"""The daemon's garbage-collector settings (pora/server/gc_tuning.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from pora.server.gc_tuning import freeze_and_tune


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if enabled:
            gc.enable()
        else:
            gc.disable()
        gc.unfreeze()


@pytest.mark.usefixtures("restored_gc")
def test_tuning_sets_the_young_threshold_and_freezes_what_exists() -> None:
    gc.unfreeze()
    _, middle, old = gc.get_threshold()
    freeze_and_tune(12_345)
    assert gc.get_threshold() == (12_345, middle, old)
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0  # the objects alive now are out of the collector's way


@pytest.mark.usefixtures("restored_gc")
def test_zero_turns_the_cyclic_collector_off() -> None:
    freeze_and_tune(0)
    assert not gc.isenabled()


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="young_threshold must be >= 0"):
        freeze_and_tune(-1)
