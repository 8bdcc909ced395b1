"""A row's `age` is its figures' own, and the kill line has a column of its own."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from raylens.cli.cluster_views import NodeTable
from raylens.live_table import NodeRow, node_table
from raylens.telemetry.host_memory import NodeSample
from raylens.telemetry.raylet_payload import GroupFigure, NodeGroupFigures

GIB = 1024**3
WALL = 1_800_000_000.0


class FakeMonitor:
    """What NodeTable reads of a monitor: the latest samples and the sampler's group figures."""

    def __init__(self) -> None:
        self.samples: list[NodeSample] = []
        self.figures: dict[str, tuple[str, NodeGroupFigures, float]] = {}

    def scraped(self, used: float, at: float) -> None:
        self.samples = [
            NodeSample(
                node_id="n" * 56,
                host="h",
                ip="10.0.0.1",
                used=used,
                total=8 * GIB,
                worker_groups="policy",
                sampled_at=at,
                error=None,
                metrics_url="http://10.0.0.1:8080/metrics",
            )
        ]

    def latest(self) -> list[NodeSample]:
        return self.samples

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        return self.figures


def _table(monitor: FakeMonitor, now: list[float]) -> NodeTable:
    return NodeTable(monitor, clock=lambda: now[0], wall=lambda: WALL + now[0])


def test_a_used_figure_returned_again_keeps_ageing_from_the_scrape_that_first_saw_it() -> None:
    monitor, now = FakeMonitor(), [100.0]
    table = _table(monitor, now)
    monitor.scraped(2 * GIB, 100.0)
    assert table.rows()[0].age_s == 0.0

    for at in (105.0, 110.0):  # Ray has not refreshed the figure: the same bytes again
        monitor.scraped(2 * GIB, at)
        now[0] = at + 0.5
        (row,) = table.rows()
    assert row.age_s == 10.5 and row.scrape_age_s == 0.5

    monitor.scraped(2 * GIB + 4096, 115.0)  # refreshed
    now[0] = 115.25
    (row,) = table.rows()
    assert row.age_s == 0.25 and row.to_json()["age_seconds"] == 0.25


def test_group_figures_are_as_old_as_their_samplers_stamp_and_the_row_shows_the_oldest() -> None:
    monitor, now = FakeMonitor(), [50.0]
    table = _table(monitor, now)
    monitor.scraped(2 * GIB, 50.0)
    stamped = WALL + 50.0 - 8.0  # the sampler took its figures 8 s before this scrape
    monitor.figures = {
        "n" * 56: ("h", NodeGroupFigures(stamped, [GroupFigure("policy", GIB, None, 3.0)]), 50.0)
    }

    (row,) = table.rows()

    assert row.group_age_s == 8.0
    assert row.to_json()["worker_group_age_seconds"] == 8.0
    shown = NodeRow(**{**row.__dict__, "group_rss": {"policy": float(GIB)}})
    assert shown.shown_age_s == 8.0
    assert row.shown_age_s == 0.0  # no group column shown: the used figure's age


def _render(rows: list[NodeRow]) -> str:
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=False, color_system=None).print(node_table(rows))
    return out.getvalue()


def test_the_kill_line_has_a_column_once_a_node_knows_it() -> None:
    plain = NodeRow("a" * 16, "h", GIB, 8 * GIB, "policy", 1.0)
    known: dict[str, Any] = {**plain.__dict__, "node_id": "b" * 16, "limit": 7.6 * GIB}

    assert "kill line" not in _render([plain])
    text = _render([plain, NodeRow(**known)])
    header = next(line for line in text.splitlines() if "kill line" in line)
    row = next(line for line in text.splitlines() if "bbbbbbbb" in line)
    assert header.index("kill line") < header.index("worker groups")
    assert "7.6 GiB" in row
