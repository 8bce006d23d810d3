"""The tuning registry (weightdiag/tuning.py): defaults, overrides that unwind, unknown knobs refused, and the
knobs in effect seen by every thread (the chunk engine's workers read them)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from weightdiag import tuning
from weightdiag.tuning import Tuning


def test_the_defaults_are_in_effect_outside_any_override():
    assert tuning.current() == Tuning()
    assert tuning.current().split_bytes == 16 << 20


def test_an_override_changes_only_its_knobs_and_unwinds_in_order():
    with tuning.override(split_bytes=4096, head_guess=1024) as outer:
        assert tuning.current() is outer
        assert (outer.split_bytes, outer.head_guess) == (4096, 1024)
        assert outer.parallel_min == Tuning().parallel_min
        with tuning.override(split_bytes=8192):
            assert (tuning.current().split_bytes, tuning.current().head_guess) == (8192, 1024)
        assert tuning.current() is outer
    assert tuning.current() == Tuning()


def test_an_override_unwinds_when_its_block_raises():
    with pytest.raises(RuntimeError), tuning.override(parallel_min=64):
        raise RuntimeError
    assert tuning.current() == Tuning()


def test_an_unknown_knob_is_a_type_error_and_changes_nothing():
    with pytest.raises(TypeError, match="SPLIT_BYTES"), tuning.override(split_bytes=4096, SPLIT_BYTES=4096):
        pass
    assert tuning.current() == Tuning()


def test_the_knobs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuning.current().split_bytes = 1  # type: ignore[misc]


def test_an_override_is_seen_by_other_threads():
    seen: list[int] = []
    with tuning.override(numpy_chunk=1000):
        worker = threading.Thread(target=lambda: seen.append(tuning.current().numpy_chunk))
        worker.start()
        worker.join()
    assert seen == [1000]


def test_the_knobs_fixture_keeps_an_override_until_the_test_ends(knobs):
    assert knobs(plain_list_rows=1).plain_list_rows == 1
    knobs(decode_chunk=40)
    assert (tuning.current().plain_list_rows, tuning.current().decode_chunk) == (1, 40)
