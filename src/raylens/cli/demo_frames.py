"""The demo's first frame: held back until every labelled node shows its groups' memory."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from raylens.live_table import NodeRow

__all__ = ["DEMO_GROUPS_WAIT_S", "wait_for_group_figures"]

DEMO_GROUPS_WAIT_S = 20.0
"""How long the demo waits, at most, for its groups' figures before its first frame."""


class _Collecting(Protocol):
    def collect_once(self) -> object: ...


class _Rows(Protocol):
    def rows(self) -> list[NodeRow]: ...


def wait_for_group_figures(
    monitor: _Collecting,
    table: _Rows,
    *,
    stop: threading.Event,
    clock: Callable[[], float],
    within_s: float,
    poll_s: float,
) -> bool:
    """Collect every ``poll_s`` until each node labelled with a group has group figures.

    Returns whether they all came within ``within_s`` (False also when ``stop`` is set);
    the samplers start at the first collection and publish a second or two later.
    """
    deadline = clock() + within_s
    while True:
        monitor.collect_once()
        labelled = [row for row in table.rows() if row.worker_groups not in ("", "none")]
        if labelled and all(row.group_rss for row in labelled):
            return True
        left = deadline - clock()
        if left <= 0 or stop.wait(min(poll_s, left)):
            return False
