"""Growth kept where the scrapes are parsed: the helper's relay and the driver's held figures.

Run in this process on simulated time: the relay is fed batches of outcomes as the helper
would be, and the figures the driver ends up holding are compared with a keeper fed the
same samples here.
"""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from raylens.telemetry.history import (
    GrowthConfig,
    GrowthFigures,
    GrowthKeeper,
    GrowthSettings,
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


def _expected(keeper: GrowthKeeper, step: int, started: float) -> dict[Hashable, GrowthFigures]:
    out = {}
    for key, outcome in _outcomes(step).items():
        values = outcome.values or {}
        out[key] = keeper.observe(
            str(key[0]), values[USED_KEY], values[TOTAL_KEY], started + outcome.elapsed, None
        )
    return out


def test_the_driver_holds_what_a_keeper_of_its_own_would_give() -> None:
    relay, held, local = GrowthRelay(CONFIG), HeldGrowth(), GrowthKeeper(CONFIG)
    held.config = CONFIG
    sent_counts = []
    for step in range(240):
        started = 1000.0 + 2.0 * step
        batch = step + 1
        changes = relay.changes(batch, held.applied, JOBS, _outcomes(step), started)
        held.apply(batch, changes, KEYS)
        sent_counts.append(len(changes[1]))
        assert held.figures == _expected(local, step, started), step

    a = held.figures[KEYS[0]]
    assert a.growth == pytest.approx(2**20 / 2.0, rel=0.05)
    assert a.limit == pytest.approx(0.95 * 64 * GIB)
    # Figures change at most once per fit interval: most batches send nothing.
    assert sum(1 for count in sent_counts if count == 0) > len(sent_counts) // 2


def test_a_reply_the_driver_never_applied_has_every_figure_sent_again() -> None:
    relay, held = GrowthRelay(CONFIG), HeldGrowth()
    held.config = CONFIG
    held.apply(1, relay.changes(1, held.applied, JOBS, _outcomes(0), 0.0), KEYS)
    lost_changes = relay.changes(2, held.applied, JOBS, _outcomes(1), 2.0)
    assert lost_changes[0] is False

    resent, changed = relay.changes(3, held.applied, JOBS, _outcomes(2), 4.0)  # 2 was lost

    assert resent is True and set(changed) == {0, 1}
    held.apply(3, (resent, changed), KEYS)
    assert set(held.figures) == set(KEYS) and held.applied == 3


def test_a_node_without_a_fresh_sample_keeps_its_figures_and_a_departed_one_is_forgotten() -> None:
    relay, held = GrowthRelay(CONFIG), HeldGrowth()
    held.config = CONFIG
    held.apply(1, relay.changes(1, 0, JOBS, _outcomes(0), 0.0), KEYS)
    before = held.figures[KEYS[1]]

    changes = relay.changes(2, 1, JOBS, _outcomes(1, silent=frozenset({1})), 2.0)
    held.apply(2, changes, KEYS)
    assert held.figures[KEYS[1]] is before

    relay.changes(3, 2, JOBS[:1], _outcomes(2, silent=frozenset({1})), 4.0)
    assert relay.keeper.history.node(str(KEYS[1][0])) is None  # b left: its history is gone
    assert relay.keeper.history.node(str(KEYS[0][0])) is not None


@pytest.mark.parametrize(
    "changes",
    [None, (False,), (False, [1]), (False, {0: (1.0, 2.0)}), (False, {5: None})],
)
def test_changes_of_another_shape_are_refused_whole(changes: object) -> None:
    relay, held = GrowthRelay(CONFIG), HeldGrowth()
    held.config = CONFIG
    held.apply(1, relay.changes(1, 0, JOBS, _outcomes(0), 0.0), KEYS)
    before = dict(held.figures)
    with pytest.raises(MalformedRows):
        held.apply(2, (False, {0: None, **changes[1]}) if _mapping(changes) else changes, KEYS)
    assert held.figures == before and held.applied == 1


def _mapping(changes: object) -> bool:
    return isinstance(changes, tuple) and len(changes) == 2 and isinstance(changes[1], dict)


def test_without_settings_the_driver_holds_nothing_and_asks_nothing() -> None:
    held = HeldGrowth()
    assert held.request() is None
    held.apply(1, (True, {0: GrowthFigures(1.0, None, False, None, None, None, ())}), KEYS)
    assert held.figures == {}
    held.config = CONFIG
    assert held.request() == (CONFIG, 0)
