"""Growth kept where the scrapes are parsed: the helper's relay and the driver's held figures.

Run in this process on simulated time: the relay is fed batches of outcomes as the helper
is (a batch's figures go with the next reply), and the figures the driver ends up holding
are compared with a keeper fed the same samples here.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Hashable

import pytest

from raylens.telemetry.history import (
    GrowthConfig,
    GrowthFigures,
    GrowthKeeper,
    GrowthSettings,
    recent_history,
    resolve_kill_line_config,
)
from raylens.telemetry.host_memory._helper_engine import HeldGrowth
from raylens.telemetry.raylet_payload import TOTAL_KEY, USED_KEY
from raylens.telemetry.scraping import MalformedRows, Outcome
from raylens.telemetry.scraping._growth_relay import GrowthRelay

GIB = 1024**3
CONFIG = GrowthConfig(GrowthSettings(window_s=60.0), resolve_kill_line_config(env={}))
KEYS: list[Hashable] = [("a" * 8, "host-a"), ("b" * 8, "host-b")]
JOBS = [(key, f"http://127.0.0.1:{9000 + i}/metrics", False) for i, key in enumerate(KEYS)]


def _outcomes(step: int, *, silent: frozenset[int] = frozenset()) -> dict[Hashable, Outcome]:
    """Node a grows 1 MiB a second; node b stays flat; ``silent`` positions did not answer."""
    values = [
        {USED_KEY: 8 * GIB + step * 2**20, TOTAL_KEY: 64 * GIB},
        {USED_KEY: 4 * GIB, TOTAL_KEY: 32 * GIB},
    ]
    return {
        key: Outcome(values[i], None, elapsed=0.25) for i, key in enumerate(KEYS) if i not in silent
    }


class _Helper:
    """The relay as the helper drives it: record first samples, reply, then record the rest."""

    def __init__(self) -> None:
        self.relay = GrowthRelay(CONFIG)
        self.batch = 0

    def answer(
        self, applied: int, outcomes: dict[Hashable, Outcome], started: float, jobs: list = JOBS
    ) -> tuple[int, tuple[bool, dict[Hashable, GrowthFigures]]]:
        self.batch += 1
        first = self.relay.observe_new(jobs, outcomes, started)
        changes = self.relay.delivery(self.batch, applied)
        self.relay.observe(jobs, outcomes, started, first)
        return self.batch, changes


def _held() -> HeldGrowth:
    held = HeldGrowth()
    held.config = CONFIG
    return held


def test_the_driver_holds_what_a_keeper_of_its_own_gave_one_batch_before() -> None:
    helper, held, local = _Helper(), _held(), GrowthKeeper(CONFIG)
    before: dict[Hashable, GrowthFigures] = {}
    carried = []
    for step in range(240):
        started = 1000.0 + 2.0 * step
        batch, changes = helper.answer(held.applied, _outcomes(step), started)
        held.apply(batch, changes, KEYS)
        carried.append(len(changes[1]))
        now = {}
        for key, outcome in _outcomes(step).items():
            values = outcome.values or {}
            now[key] = local.observe(
                str(key[0]), values[USED_KEY], values[TOTAL_KEY], started + outcome.elapsed, None
            )
        # A node's first figures go with the answer that brought its first sample.
        assert held.figures == (now if step == 0 else before), step
        before = now

    a = held.figures[KEYS[0]]
    assert a.growth == pytest.approx(2**20 / 2.0, rel=0.05)
    assert a.limit == pytest.approx(0.95 * 64 * GIB)
    # Figures change at most once per fit interval: most replies carry none.
    assert sum(1 for count in carried if count == 0) > len(carried) // 2


def test_a_reply_never_applied_has_every_node_s_figures_sent_again_answered_or_not() -> None:
    helper, held = _Helper(), _held()
    for step in range(3):
        held.apply(*helper.answer(held.applied, _outcomes(step), 2.0 * step), KEYS)
    before = dict(held.figures)
    assert set(before) == set(KEYS)
    helper.answer(held.applied, _outcomes(3), 6.0)  # this reply is lost on the way

    # Node b does not answer the next batch: its figures still come again.
    batch, (resent, changed) = helper.answer(held.applied, _outcomes(4, silent=frozenset({1})), 8.0)
    held.apply(batch, (resent, changed), KEYS)

    assert resent is True and set(changed) == set(KEYS)
    assert held.figures[KEYS[1]] == before[KEYS[1]]
    assert held.applied == batch


def test_a_node_without_a_fresh_sample_keeps_its_figures_and_a_departed_one_is_forgotten() -> None:
    helper, held = _Helper(), _held()
    for step in range(2):
        held.apply(*helper.answer(held.applied, _outcomes(step), 2.0 * step), KEYS)
    before = held.figures[KEYS[1]]

    held.apply(*helper.answer(held.applied, _outcomes(2, silent=frozenset({1})), 4.0), KEYS)
    assert held.figures[KEYS[1]] is before

    # b leaves the cluster: the helper forgets its history, the driver its figures.
    held.apply(*helper.answer(held.applied, _outcomes(3), 6.0, jobs=JOBS[:1]), KEYS[:1])
    assert set(held.figures) == {KEYS[0]}
    assert helper.relay.keeper.history.node(str(KEYS[1][0])) is None
    assert helper.relay.keeper.history.node(str(KEYS[0][0])) is not None


def test_the_held_mapping_is_replaced_never_changed() -> None:
    helper, held = _Helper(), _held()
    held.apply(*helper.answer(held.applied, _outcomes(0), 0.0), KEYS)
    held.apply(*helper.answer(held.applied, _outcomes(1), 2.0), KEYS)
    seen = held.figures
    copy = dict(seen)
    held.apply(*helper.answer(held.applied, _outcomes(2), 4.0, jobs=JOBS[:1]), KEYS[:1])
    assert seen == copy and held.figures is not seen


@pytest.mark.parametrize(
    "changes",
    [None, (False,), (False, [1]), (False, {KEYS[0]: (1.0, 2.0)}), (True, {KEYS[0]: None})],
)
def test_changes_of_another_shape_are_refused_whole(changes: object) -> None:
    helper, held = _Helper(), _held()
    for step in range(2):
        held.apply(*helper.answer(held.applied, _outcomes(step), 2.0 * step), KEYS)
    before, applied = dict(held.figures), held.applied
    with pytest.raises(MalformedRows):
        held.apply(applied + 1, changes, KEYS)
    assert held.figures == before and held.applied == applied


def test_without_settings_the_driver_holds_nothing_and_asks_nothing() -> None:
    held = HeldGrowth()
    assert held.request(0.0) is None
    held.apply(1, (True, {KEYS[0]: GrowthFigures(1.0, None, False, None, None, None, ())}), KEYS)
    assert held.figures == {}
    held.config = CONFIG
    assert held.request(12.5) == (CONFIG, 0, 12.5)


def test_after_three_failures_in_a_row_the_driver_stops_asking_the_helper_for_growth() -> None:
    helper, held = _Helper(), _held()
    held.apply(*helper.answer(held.applied, _outcomes(0), 0.0), KEYS)
    held.failed()
    held.failed()
    held.apply(*helper.answer(held.applied, _outcomes(1), 2.0), KEYS)  # a success in between
    assert held.kept and held.request(4.0) is not None
    for _ in range(3):
        held.failed()
    assert not held.kept and held.request(6.0) is None
    held.reset()  # a new helper is tried afresh
    assert held.kept


def test_a_sample_the_helper_stamped_just_after_the_asked_moment_is_in_its_recent_history() -> None:
    helper = _Helper()
    helper.answer(0, _outcomes(0), 100.0)  # stamped at 100.25
    history = helper.relay.keeper.history

    on_time = recent_history(history, str(KEYS[0][0]), 100.2, late_by=0.25)
    strict = recent_history(history, str(KEYS[0][0]), 100.2)

    assert on_time["node_used"] is not None and len(on_time["node_used"]["samples"]) == 1
    assert strict["node_used"] is None


def _serving() -> tuple[socket.socket, socket.socket, threading.Thread]:
    from raylens.telemetry.scraping import ScrapeLimits
    from raylens.telemetry.scraping._helper_program import serve

    driver, helper = socket.socketpair()
    server = threading.Thread(target=serve, args=(helper, ScrapeLimits(1.0)), daemon=True)
    server.start()
    return driver, helper, server


def _recorded(driver: socket.socket, batch: int) -> None:
    """Wait until the helper has recorded ``batch``: it answers messages in order, and records
    a batch right after answering it, so its answer to a history request comes after."""
    from raylens.telemetry.scraping import read_message, write_message

    write_message(driver, ("history", 1000 + batch, "n", 0.0, 0.0))
    assert read_message(driver)[:2] == ("history", 1000 + batch)


def test_a_failure_in_the_growth_code_costs_the_growth_never_the_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raylens.telemetry.scraping import read_message, write_message

    def broken(*_args: object) -> None:
        raise RuntimeError("a fit went wrong")

    driver, helper, server = _serving()
    try:
        assert read_message(driver) == ("ready",)
        replies = []
        for batch in range(1, 5):
            if batch == 2:
                monkeypatch.setattr(GrowthRelay, "observe", broken)
            if batch == 3:
                monkeypatch.undo()
            now = time.monotonic()
            write_message(driver, ("scrape", batch, [], now + 1.0, {}, (CONFIG, batch - 1, now)))
            replies.append(read_message(driver))
            _recorded(driver, batch)
    finally:
        driver.close()
        server.join(5)
        helper.close()

    assert [reply[:3] for reply in replies] == [("result", b, []) for b in range(1, 5)]
    # Batch 2's recording failed: the next reply says so, and a new relay starts after it.
    assert [reply[3] for reply in replies] == [(True, {}), (False, {}), None, (True, {})]


def test_growth_turned_off_then_on_starts_the_helper_on_a_new_history() -> None:
    from raylens.telemetry.scraping import read_message, write_message

    driver, helper, server = _serving()
    outcomes = []
    try:
        assert read_message(driver) == ("ready",)
        asks = [(CONFIG, 0), (CONFIG, 1), None, (CONFIG, 2), (CONFIG, 4)]
        for batch, ask in enumerate(asks, start=1):
            now = time.monotonic()
            growth = None if ask is None else (*ask, now)
            write_message(driver, ("scrape", batch, [], now + 1.0, {}, growth))
            outcomes.append(read_message(driver)[3])
            _recorded(driver, batch)
    finally:
        driver.close()
        server.join(5)
        helper.close()

    # Off for batch 3: the relay is dropped, so batch 4 starts a new one and resends all.
    assert outcomes == [(True, {}), (False, {}), None, (True, {}), (False, {})]


class _NamedOnly:
    """A monitor that could keep growth elsewhere but is not read through its records."""

    def __init__(self) -> None:
        self.asked: list[object] = []

    def keep_growth(self, config: object) -> None:
        self.asked.append(config)

    def kept_growth(self) -> dict[Hashable, GrowthFigures]:
        return {}

    def recent_history(self, node_id: str, at: float) -> None:
        return None

    def latest(self) -> list[object]:
        return []

    def group_figures(self) -> dict[str, object]:
        return {}


def test_a_monitor_not_read_through_its_records_keeps_no_growth_elsewhere() -> None:
    from raylens.telemetry.growth import GrowthCycle

    monitor = _NamedOnly()
    cycle = GrowthCycle(settings=CONFIG.settings, kill_line=CONFIG.kill_line)
    cycle.attach_to(monitor)
    cycle(monitor)  # type: ignore[arg-type]
    assert monitor.asked == []


def test_asking_the_helper_to_keep_growth_never_waits_on_a_batch_in_progress() -> None:
    from raylens.telemetry.host_memory._helper_engine import HelperEngine
    from raylens.telemetry.scraping import ScrapeLimits

    engine = HelperEngine(ScrapeLimits(1.0))
    held, release = threading.Event(), threading.Event()

    def batch_in_progress() -> None:
        with engine._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=batch_in_progress)
    holder.start()
    try:
        assert held.wait(10)
        done = threading.Event()
        asker = threading.Thread(target=lambda: (engine.keep_growth(CONFIG), done.set()))
        asker.start()
        assert done.wait(5)  # returned while the lock is still held
        assert not release.is_set()
    finally:
        release.set()
        holder.join(10)
        engine.close(1.0)


def test_a_new_node_s_first_figures_go_with_the_answer_that_brought_it() -> None:
    helper, held = _Helper(), _held()
    held.apply(*helper.answer(held.applied, _outcomes(0, silent=frozenset({1})), 0.0), KEYS)
    assert set(held.figures) == {KEYS[0]}
    assert held.figures[KEYS[0]].limit == pytest.approx(0.95 * 64 * GIB)

    held.apply(*helper.answer(held.applied, _outcomes(1), 2.0), KEYS)  # b answers at last

    assert held.figures[KEYS[1]].limit == pytest.approx(0.95 * 32 * GIB)
