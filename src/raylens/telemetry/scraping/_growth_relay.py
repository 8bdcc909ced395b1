"""The helper's side of growth: keep each node's history where its payload is parsed.

When the driver asks for it (its batches carry the keeper's settings), the helper records
each node that answered into a :class:`~raylens.telemetry.history.GrowthKeeper` once it
has written the batch's reply, so the recording and the fits never hold up an answer,
and the next reply carries the figures that changed: a node's figures are one batch
behind its sample. A node's first sample is the exception: recorded before the reply
(it has nothing to fit), so its first figures go with it, and a ``raylens watch --once``
shows each node's kill line and its samplers' growth. Only figures that changed since the reply the driver says it applied
go (a node's figures change at most once per fit interval, or per sampler reading while
the sampler's own growth stands in, so most replies carry none); when the driver has not
applied the last reply (lost on the way), every node's figures go again.

A batch's jobs are keyed by the monitor's ``(node id, host)``; the history is kept by
node id, as a post-mortem asks for it.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Mapping, Sequence

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

#: ``(every node's figures sent again, {job key: figures})``.
GrowthChanges = tuple[bool, dict[Hashable, GrowthFigures]]


def _node_id(key: Hashable) -> str:
    return str(key[0]) if isinstance(key, tuple) and key else str(key)


class GrowthRelay:
    """A keeper, its latest figures per key, and which of them the driver holds.

    Not thread-safe.
    """

    def __init__(self, config: GrowthConfig) -> None:
        self.config = config
        self.keeper = GrowthKeeper(config)
        #: The keeper's latest figures per job key.
        self._latest: dict[Hashable, GrowthFigures] = {}
        #: What the driver holds once it has applied the last reply.
        self._sent: dict[Hashable, GrowthFigures] = {}
        #: The batch whose reply carried figures last (-1: none yet).
        self._answered = -1

    def delivery(self, batch: int, applied: int) -> GrowthChanges:
        """What batch ``batch``'s reply carries, the driver having applied batch ``applied``."""
        latest = self._latest
        resent = applied != self._answered
        if resent:
            changed = dict(latest)
        else:
            sent = self._sent
            changed = {
                key: figures for key, figures in latest.items() if sent.get(key) is not figures
            }
        if resent or changed or len(self._sent) != len(latest):
            self._sent = dict(latest)
        self._answered = batch
        return resent, changed

    def observe_new(
        self, jobs: Sequence[Job], results: Mapping[Hashable, Outcome], started: float
    ) -> set[Hashable]:
        """Record the answers of nodes with no figures yet, and return their keys.

        Run before the batch's reply, so a node's first figures (its kill line, the growth
        its sampler publishes) go with the answer that brought them: a first sample has no
        history to fit, so this costs little even for a whole new cluster.
        """
        latest = self._latest
        first: set[Hashable] = set()
        for job in jobs:
            key = job[0]
            outcome = results.get(key)
            if key in latest or outcome is None or not outcome.values:
                continue
            latest[key] = self._record(_node_id(key), outcome, started)
            first.add(key)
        return first

    def observe(
        self,
        jobs: Sequence[Job],
        results: Mapping[Hashable, Outcome],
        started: float,
        done: Container[Hashable] = (),
    ) -> None:
        """Record the batch's answers but those of ``done``; ``started`` is the driver's time
        at sending the batch (an answer is stamped with it plus the answer's age).

        A node without a fresh sample keeps its figures; one no longer in the batch is
        forgotten, history and all.
        """
        latest = self._latest
        listed: set[str] = set()
        for job in jobs:
            key = job[0]
            node = _node_id(key)
            listed.add(node)
            outcome = results.get(key)
            if outcome is None or not outcome.values or key in done:
                continue
            latest[key] = self._record(node, outcome, started)
        self.keeper.retain(listed)
        keys = {job[0] for job in jobs}
        if not keys.issuperset(latest):
            self._latest = {key: figures for key, figures in latest.items() if key in keys}

    def _record(self, node: str, outcome: Outcome, started: float) -> GrowthFigures:
        """One answer into the keeper, stamped ``started`` plus its age; the node's figures."""
        values = outcome.values or {}
        return self.keeper.observe(
            node,
            values.get(USED_KEY),
            values.get(TOTAL_KEY),
            started + outcome.elapsed,
            outcome.groups,
        )

    def recent_history(self, node_id: str, at: float, late_by: float = 0.0) -> RecentHistory:
        return recent_history(self.keeper.history, node_id, at, late_by=late_by)
