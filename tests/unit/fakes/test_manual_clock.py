"""ManualClock moves only when a test moves it; ClockedStop's waits pass on it."""

from __future__ import annotations

import pytest

from raylens_fakes.clock import ClockedStop, ManualClock


def test_a_manual_clock_reads_where_it_was_set_until_moved() -> None:
    clock = ManualClock(100.0)
    assert (clock(), clock()) == (100.0, 100.0)
    clock.advance(2.5)
    assert clock() == clock.now == 102.5
    clock.now = 7.0
    assert clock() == 7.0
    assert ManualClock()() == 0.0


def test_a_manual_clock_refuses_to_run_backwards() -> None:
    clock = ManualClock(5.0)
    with pytest.raises(ValueError, match=r"-1\.0"):
        clock.advance(-1.0)
    assert clock() == 5.0


def test_a_clocked_stop_wait_moves_the_clock_by_its_timeout_and_records_it() -> None:
    clock = ManualClock(10.0)
    stop = ClockedStop(clock)
    assert stop.wait(1.5) is False
    assert stop.wait(0.5) is False
    assert (clock(), stop.waits) == (12.0, [1.5, 0.5])
    stop.set()
    assert stop.wait(3.0) is True
    assert clock() == 15.0


def test_a_clocked_stop_sets_itself_once_the_clock_reaches_its_end() -> None:
    clock = ManualClock(0.0)
    stop = ClockedStop(clock, until=2.0)
    assert stop.wait(1.0) is False
    assert stop.wait(1.0) is True
    assert stop.is_set()


def test_a_clocked_stop_needs_a_timeout() -> None:
    with pytest.raises(ValueError, match="timeout"):
        ClockedStop(ManualClock()).wait()
