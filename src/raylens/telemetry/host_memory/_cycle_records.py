"""What a host-memory cycle makes of its outcomes: standings, records and warnings.

Ordering and fairness: exactly one request per node per cycle and no retry
within it. Each node keeps a standing from its last outcome, and the next cycle
asks nodes in that order: those that answered first, those that failed fast
next. Wedged nodes (those that ran into the deadline, or whose deadline passed
before a request slot freed up) are asked in a lane of their own with its own
request slots, least recently asked first: they cannot keep healthy nodes
waiting for a slot, and when there are more of them than slots they take turns.

:class:`CycleRecords` turns one cycle's outcomes into one :class:`NodeRecord`
per listed node (a node that gave no sample keeps its last good figures, with
why), publishes them to the monitor's :class:`Snapshot` in one step, warns once
per failing node, and forgets everything about nodes that left.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Hashable, Mapping

from raylens.lens import reset_warn_once, warn_once
from raylens.safe_text import printable
from raylens.telemetry.host_memory._nodes import RayNode
from raylens.telemetry.host_memory._placement import DEFAULT_REGISTRY
from raylens.telemetry.host_memory._snapshot import (
    HealthFields,
    NodeRecord,
    Snapshot,
    node_attributes,
)
from raylens.telemetry.names import LOGGER_NAME, NO_WORKER_GROUPS
from raylens.telemetry.raylet_payload import (
    ERROR_INTERNAL,
    ERROR_NO_METRICS_PORT,
    ERROR_TIMEOUT,
    NodeGroupFigures,
    NodeOomCounts,
)
from raylens.telemetry.scraping import Outcome

__all__ = ["NO_METRICS_ERROR", "STOPPED_ERROR", "CycleRecords", "NodeKey"]

logger = logging.getLogger(LOGGER_NAME)

STOPPED_ERROR = "not answered before monitoring stopped"
#: Why a node without a metrics port has no sample; short enough for a table cell.
NO_METRICS_ERROR = "serves no metrics (MetricsExportPort missing or -1): needs 'ray[default]'"

NodeKey = tuple[str, str]


class _Standing(enum.IntEnum):
    """How a node fared last time; lower is asked earlier."""

    ANSWERED = 0
    FAILED = 1
    WEDGED = 2


#: Standing of a node never asked: treated like one that failed fast.
_NEW = (_Standing.FAILED, -1)


class CycleRecords:
    """The publishing side of :class:`~._monitor.HostMemoryMonitor`, as one of its bases.

    The attributes below are set by the monitor's constructor; a cycle changes
    ``_records``, ``_standing`` and ``_warned`` under the monitor's cycle lock.
    """

    max_age: float
    scrape_timeout: float
    snapshot: Snapshot
    _cycles: int
    #: The latest cycle's record of every live node, as published to the snapshot.
    _records: Mapping[NodeKey, NodeRecord]
    _standing: dict[NodeKey, tuple[_Standing, int]]
    _warned: set[NodeKey]

    def _forget_departed(self, live: set[NodeKey]) -> None:
        """Drop everything held about nodes that left, so state stays as large as the cluster."""
        # Every node stays, cycle after cycle, in a steady cluster: checked in one call each.
        if not live.issuperset(self._standing):
            for key in [key for key in self._standing if key not in live]:
                del self._standing[key]
        for key in [key for key in self._warned if key not in live]:
            self._warned.discard(key)
            reset_warn_once(_warning_key(key))
        if not live.issuperset(self._records):
            self._records = {key: r for key, r in self._records.items() if key in live}
        self.snapshot.retain(live)

    def _publish(
        self,
        nodes: list[RayNode],
        results: dict[Hashable, Outcome],
        started: float,
        *,
        stopped: bool,
    ) -> None:
        """Publish one cycle; ``stopped`` when :meth:`stop` cut it short (nobody is blamed).

        Builds one :class:`NodeRecord` per listed node and publishes them as one mapping.
        """
        previous = self._records
        records: dict[NodeKey, NodeRecord] = {}
        version, labels = DEFAULT_REGISTRY.labels_by_node()
        # One standing shared by every node that answers this cycle (a tuple per cycle).
        answered = (_Standing.ANSWERED, self._cycles)
        standing, warned, max_age = self._standing, self._warned, self.max_age
        for node in nodes:
            key = node.key
            label = labels.get(node.node_id, NO_WORKER_GROUPS)
            before = previous.get(key)
            attributes = (
                before.attributes
                if before is not None and before.worker_groups == label
                else node_attributes(node, label)
            )
            outcome = results.get(key)
            if outcome is None:
                outcome = self._unanswered(stopped)
            elif outcome.values:  # the node answered: the common case, kept short
                values, _, _, asked, elapsed, error_type, duration, groups, oom, refused = outcome
                if refused is not None:
                    _warn_refused(node, refused)
                standing[key] = answered
                # Aged from the node's answer, not from the end of the cycle.
                sampled_at = started + elapsed
                expires_at = sampled_at + max_age
                duration = _request_seconds(duration, asked, error_type, elapsed)
                if oom is not None and before is not None and oom == before.oom:
                    oom = before.oom  # unchanged counters: the object the last record holds
                records[key] = NodeRecord(
                    node,
                    values,
                    sampled_at,
                    None,
                    (1, None, duration, sampled_at, expires_at),
                    label,
                    version,
                    attributes,
                    groups,
                    oom,
                    expires_at,
                )
                if key in warned:
                    warned.discard(key)
                    reset_warn_once(_warning_key(key))
                continue
            records[key] = self._unanswered_record(
                node, outcome, before, label, version, attributes, started
            )
        self._records = records
        self.snapshot.publish(records)

    def _unanswered(self, stopped: bool) -> Outcome:
        """The outcome of a node missing from an engine's results."""
        if stopped:
            return Outcome(None, STOPPED_ERROR, asked=False)
        return Outcome(
            None,
            f"no answer within the {self.scrape_timeout:g} s scrape timeout",
            wedged=True,
            error_type=ERROR_TIMEOUT,
            duration=self.scrape_timeout,
        )

    def _unanswered_record(
        self,
        node: RayNode,
        outcome: Outcome,
        before: NodeRecord | None,
        label: str,
        version: int,
        attributes: Mapping[str, str],
        started: float,
    ) -> NodeRecord:
        """The record of a node that gave no sample: its last good figures, why, and a warning."""
        self._note_standing(node.key, outcome)
        error = printable(outcome.error or "no sample")
        if outcome.error_type == ERROR_NO_METRICS_PORT:
            warn_once(
                "host_memory.no_metrics_port",
                f"Ray node {node.node_id} ({printable(node.host)}) serves no metrics, so "
                "raylens shows no memory for it (nor for any other such node): its Ray was "
                "installed without its default extra. Run pip install 'ray[default]' "
                "on every node and restart Ray there.",
                logger=logger,
            )
        elif error != STOPPED_ERROR:
            self._warned.add(node.key)
            warn_once(
                _warning_key(node.key),
                f"no host-memory sample from node {node.node_id} ({printable(node.host)}, "
                f"{printable(node.metrics_url)}): {error}",
                logger=logger,
            )
        return NodeRecord(
            node,
            None if before is None else before.values,
            None if before is None else before.sampled_at,
            error,
            self._health(outcome, started) if outcome.error != STOPPED_ERROR else None,
            label,
            version,
            attributes,
        )

    def records(self) -> Mapping[NodeKey, NodeRecord]:
        """The latest cycle's :class:`NodeRecord` of every live node, by ``(node id, host)``.

        The mapping the cycle published to :attr:`snapshot`; never changed afterwards.
        """
        return self._records

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        """Per node id: host name, the per-group figures its payload carried, and when read.

        Only nodes whose latest scrape answered and carried a sampler's series; the
        time is on this monitor's clock.
        """
        return {
            record.node.node_id: (record.node.host, record.groups, record.sampled_at)
            for record in self._records.values()
            if record.groups is not None and record.sampled_at is not None
        }

    def oom_counts(self) -> dict[str, tuple[str, NodeOomCounts, float]]:
        """Per node id: host name, the kill counters its latest scrape carried, and when read.

        Only nodes whose latest scrape answered and carried a counter; the time is on
        this monitor's clock.
        """
        return {
            record.node.node_id: (record.node.host, record.oom, record.sampled_at)
            for record in self._records.values()
            if record.oom is not None and record.sampled_at is not None
        }

    def _health(self, outcome: Outcome, started: float) -> HealthFields:
        """The scrape-health entry's fields (as :class:`ScrapeHealth` orders them) for one
        node's ``outcome`` in a cycle begun at ``started``."""
        observed_at = started + outcome.elapsed
        if outcome.values:
            up, error_type = 1, None
        else:
            up = 0
            error_type = outcome.error_type or (ERROR_TIMEOUT if outcome.wedged else ERROR_INTERNAL)
        duration = _request_seconds(
            outcome.duration, outcome.asked, outcome.error_type, outcome.elapsed
        )
        return (up, error_type, duration, observed_at, observed_at + self.max_age)

    def _note_standing(self, key: NodeKey, outcome: Outcome) -> None:
        if outcome.error == STOPPED_ERROR or outcome.error_type == ERROR_NO_METRICS_PORT:
            return
        if outcome.values:
            standing = _Standing.ANSWERED
        elif outcome.wedged:
            standing = _Standing.WEDGED
        else:
            standing = _Standing.FAILED
        last_asked = self._standing.get(key, (_Standing.FAILED, -1))[1]
        self._standing[key] = (standing, self._cycles if outcome.asked else last_asked)


def _request_seconds(
    duration: float | None, asked: bool, error_type: str | None, elapsed: float
) -> float | None:
    """How long a node's request took: the engine's own timing, else (for a replaced engine
    that does not time its requests) the time to its outcome; None when nothing was sent."""
    if duration is None and asked and error_type != ERROR_NO_METRICS_PORT:
        return elapsed
    return duration


def _warn_refused(node: RayNode, refused: tuple[int, tuple[str, ...]]) -> None:
    """One warning per node naming what of its payload was not believed: values beyond
    physical bounds, samplers stamped in the future, publishers that are no known sampler."""
    count, named = refused
    more = f" and {count - len(named)} more" if count > len(named) else ""
    warn_once(
        f"host_memory.refused.{node.node_id}",
        f"node {printable(node.node_id[:56])} ({printable(node.host)}) published {count} "
        "value(s) or sampler(s) raylens does not believe (beyond physical bounds, stamped "
        "in the future, or not a sampler raylens started), refused: "
        f"{printable(', '.join(named))[:600]}{more}; "
        "another job may be publishing series under raylens' names (warned once per node)",
        logger=logger,
    )


def _warning_key(key: NodeKey) -> str:
    return f"host_memory.scrape.{key[0]}"
