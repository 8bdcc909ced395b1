"""The helper's side of growth: keep each node's history where its payload is parsed.

When the driver asks for it (its batches carry the keeper's settings), the helper records
each node that answered into a :class:`~raylens.telemetry.history.GrowthKeeper` and sends
back only the figures that changed since the batch the driver says it has applied: a
node's figures change at most once per fit interval, so most batches send none. When the
driver has not applied the batch last answered (a reply was lost on the way), every
node's figures go again.

A batch's jobs are keyed by the monitor's ``(node id, host)``; the history is kept by
node id, as a post-mortem asks for it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from raylens.telemetry.history import (
    GrowthConfig,
    GrowthFigures,
    GrowthKeeper,
    RecentHistory,
    recent_history,
)
from raylens.telemetry.raylet_payload import TOTAL_KEY, USED_KEY
from raylens.telemetry.scraping._engine import Job, Outcome

__all__ = ["GrowthChanges", "GrowthRelay"]

#: ``(every node's figures sent again, {position in the batch: figures or None})``.
GrowthChanges = tuple[bool, dict[int, GrowthFigures | None]]


def _node_id(key: Hashable) -> str:
    return str(key[0]) if isinstance(key, tuple) and key else str(key)


class GrowthRelay:
    """A keeper, and which of its figures the driver holds. Not thread-safe."""

    def __init__(self, config: GrowthConfig) -> None:
        self.config = config
        self.keeper = GrowthKeeper(config)
        self._sent: dict[Hashable, GrowthFigures] = {}
        #: The batch whose figures were last sent (-1: none yet).
        self._answered = -1

    def changes(
        self,
        batch: int,
        applied: int,
        jobs: Sequence[Job],
        results: Mapping[Hashable, Outcome],
        started: float,
    ) -> GrowthChanges:
        """Record the batch's answers (``started`` is its start, on the monotonic clock)."""
        resent = applied != self._answered
        if resent:
            self._sent = {}
        sent = self._sent
        observe = self.keeper.observe
        changed: dict[int, GrowthFigures | None] = {}
        listed: set[str] = set()
        for position, job in enumerate(jobs):
            key = job[0]
            node = _node_id(key)
            listed.add(node)
            outcome = results.get(key)
            if outcome is None or not outcome.values:
                continue  # no fresh sample: the driver's figures stand
            values = outcome.values
            figures = observe(
                node,
                values.get(USED_KEY),
                values.get(TOTAL_KEY),
                started + outcome.elapsed,
                outcome.groups,
            )
            if sent.get(key) is not figures:
                sent[key] = changed[position] = figures
        self.keeper.retain(listed)
        if len(sent) > len(jobs):
            keys = {job[0] for job in jobs}
            self._sent = {key: figures for key, figures in sent.items() if key in keys}
        self._answered = batch
        return resent, changed

    def recent_history(self, node_id: str, at: float) -> RecentHistory:
        return recent_history(self.keeper.history, node_id, at)
