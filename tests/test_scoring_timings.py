"""Tests for pipeline.scoring.timings: seconds per part of an evaluation, each part timed exclusively."""

from __future__ import annotations

import pytest

from pipeline.scoring import timings as timings_module
from pipeline.scoring.timings import TIMED, Timings


def test_nested_parts_are_timed_exclusively_with_a_hand_driven_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # encode runs 0..10 with probes inside it 2..5 and again 7..8: encode 10 - 3 - 1 = 6, probes 3 + 1 = 4; then fms 10..12.
    ticks = iter([0.0, 2.0, 5.0, 7.0, 8.0, 10.0, 10.0, 12.0])
    monkeypatch.setattr(timings_module.time, "perf_counter", lambda: next(ticks))
    timings = Timings()
    with timings.part("encode"):
        with timings.part("probes"):
            pass
        with timings.part("probes"):
            pass
    with timings.part("fms"):
        pass
    record = timings.record(total=13.0)
    assert (record["encode"], record["probes"], record["fms"], record["total"]) == (6.0, 4.0, 2.0, 13.0)
    assert list(record) == [*TIMED, "total"] and record["explain"] == 0.0


def test_an_unknown_part_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown part 'training'"):
        with Timings().part("training"):
            pass
