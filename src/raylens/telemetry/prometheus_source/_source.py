"""``PrometheusSource``: the cluster's figures read from a Prometheus, one cycle at a time.

It answers what a host-memory monitor answers (``latest``, ``group_figures``,
``oom_counts``, cycle hooks), so the watch table, ``--json``, the growth cycle and the
OOM watch run on it unchanged. A cycle sends the same fixed queries whatever the number
of nodes; nothing is scraped from the nodes themselves.

Staleness: a node whose latest raylet sample is older than twice the Prometheus scrape
interval, or whose target Prometheus can no longer scrape (``up`` 0), is failing, and
its error says how old its figures are. A node keeps being reported while Prometheus
lists its target; one whose target is gone has left. State is bounded by ``max_nodes``.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from raylens.cluster import ClusterView, ray_call_errors
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.host_memory import (
    NO_WORKER_GROUPS,
    CycleHooks,
    NodeSample,
    format_worker_groups,
    ray_nodes,
)
from raylens.telemetry.physical_bounds import bound_payload
from raylens.telemetry.prometheus_source._assemble import (
    QUERIES,
    CycleFigures,
    NodeFound,
    assemble,
    collector_paused,
)
from raylens.telemetry.prometheus_source._client import Fetcher, fetch_answers
from raylens.telemetry.prometheus_source._queries import Query
from raylens.telemetry.prometheus_source._settings import PrometheusSettings
from raylens.telemetry.raylet_payload import (
    TOTAL_KEY,
    USED_KEY,
    NodeGroupFigures,
    NodeOomCounts,
)
from raylens.validation import positive_seconds

__all__ = ["MAX_NODES", "PrometheusSource"]

#: Most nodes one source reports (and remembers); the rest are left out, by instance order.
MAX_NODES = 100_000
_LOGGER = logging.getLogger("raylens.telemetry.prometheus_source")

CycleHook = Callable[[Any], None]
#: The queries a node's row cannot do without.
_ESSENTIAL = (Query.NODE_USED, Query.FRESH)


class _Held:
    """What the source remembers of one node between cycles."""

    __slots__ = ("fresh_at", "ip", "total", "used")

    def __init__(self) -> None:
        self.used: float | None = None
        self.total: float | None = None
        self.fresh_at: float | None = None
        self.ip = ""


def _bound(found: NodeFound) -> None:
    """Hold ``found``'s figures to physical bounds, as direct scraping holds a payload's.

    Anyone who can publish series that Prometheus scrapes can publish impossible ones; what
    falls outside is refused (a group without a believable RSS is left out), warned once per
    node.
    """
    values = {}
    if found.used is not None:
        values[USED_KEY] = found.used
    if found.total is not None:
        values[TOTAL_KEY] = found.total
    bounded = bound_payload(values, found.groups, found.oom)
    if not bounded.refused_count:
        return
    found.used, found.total = bounded.values.get(USED_KEY), bounded.values.get(TOTAL_KEY)
    found.groups, found.oom = bounded.groups, bounded.oom
    more = bounded.refused_count - len(bounded.refused)
    warn_once(
        f"prometheus_source.refused.{found.instance}",
        f"node {printable(found.instance)[:120]}: Prometheus holds value(s) no machine can "
        f"have, refused: {printable(', '.join(bounded.refused))[:600]}"
        + (f" and {more} more" if more > 0 else ""),
        logger=_LOGGER,
    )


def _age_text(age: float | None) -> str:
    return "no figures yet" if age is None else f"figures {age:.0f} s old"


class PrometheusSource:
    """Reads every node's figures from one Prometheus; see the module docstring.

    ``cluster``, when connected, names each target by its Ray node id and host (a target
    is matched to the node whose metrics agent it scrapes); without one, a node is named
    by its target address. ``fetch`` sends a cycle's queries (tests give a fake);
    ``clock`` is the monotonic clock samples are stamped with, ``wall`` the Unix clock
    ages are measured on.
    """

    def __init__(
        self,
        settings: PrometheusSettings,
        *,
        interval: float = 5.0,
        cluster: ClusterView | None = None,
        fetch: Fetcher = fetch_answers,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_nodes: int = MAX_NODES,
    ) -> None:
        self.settings = settings
        self.interval = positive_seconds("interval", interval)
        self.cluster = cluster
        self.fetch = fetch
        self.clock = clock
        self.wall = wall
        self.max_nodes = max_nodes
        #: A sample is exported for at most this long after its cycle.
        self.max_age = 2 * max(self.interval, settings.scrape_interval_s)
        self._held: dict[str, _Held] = {}
        self._samples: list[NodeSample] = []
        self._groups: dict[str, tuple[str, NodeGroupFigures, float]] = {}
        self._oom: dict[str, tuple[str, NodeOomCounts, float]] = {}
        self._hooks = CycleHooks("Prometheus-source", "prometheus_source.hook", _LOGGER)
        self._consumer = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: The latest cycle's figures as assembled (query errors included), for notes.
        self.last_cycle: CycleFigures | None = None

    # Hooks and consumers, as a host-memory monitor has them ---------------------------

    def add_cycle_hook(self, hook: CycleHook, *, on_stop: Callable[[], None] | None = None) -> None:
        """Run ``hook(source)`` after every cycle; ``on_stop`` when the source stops."""
        self._hooks.add(hook, on_stop)

    def remove_cycle_hook(self, hook: CycleHook) -> None:
        """Stop running ``hook``; an unknown one is ignored."""
        self._hooks.remove(hook)

    def declare_consumer(self) -> None:
        """Say that someone reads the figures (every cycle then queries)."""
        self._consumer = True

    @property
    def has_consumer(self) -> bool:
        """True once a consumer was declared."""
        return self._consumer

    # One cycle ------------------------------------------------------------------------

    def collect_once(self) -> None:
        """Send the cycle's queries, publish what they say, then run the cycle hooks."""
        answers = self.fetch(self.settings, QUERIES)
        names = self._names()
        with collector_paused():
            figures = assemble(
                answers,
                max_series=self.settings.max_series,
                max_nodes=self.max_nodes,
                known=set(self._held),
            )
            del answers
            self._publish(figures, names)
        self.last_cycle = figures
        for query, why in figures.errors.items():
            warn_once(
                f"prometheus_source.query.{query.name}",
                f"the Prometheus query for {query.name.lower()} failed: {printable(why)[:200]}; "
                "its figures are missing this cycle (warned once)",
                logger=_LOGGER,
            )
        self._hooks.run(self, stopping=False)

    def _names(self) -> dict[str, tuple[str, str]]:
        """``instance -> (node id, host)`` from the connected cluster; empty without one."""
        if self.cluster is None:
            return {}
        try:
            nodes = ray_nodes(self.cluster)
        except ray_call_errors(None, LookupError):
            return {}
        names = {}
        for node in nodes:
            address = urllib.parse.urlsplit(node.metrics_url).netloc
            if address:
                names[address] = (node.node_id, node.host)
        return names

    def _publish(self, figures: CycleFigures, names: Mapping[str, tuple[str, str]]) -> None:
        now, wall = self.clock(), self.wall()
        reference = figures.evaluated_at if figures.evaluated_at is not None else wall
        # Without the node memory or its sample times, no node can be judged this cycle:
        # every node known is failing, with the reason.
        missing = [query for query in _ESSENTIAL if query in figures.errors]
        unanswered = bool(missing)
        why_none = figures.errors[missing[0]] if missing else ""
        limit = 2 * self.settings.scrape_interval_s
        samples: list[NodeSample] = []
        groups: dict[str, tuple[str, NodeGroupFigures, float]] = {}
        oom: dict[str, tuple[str, NodeOomCounts, float]] = {}
        held_now: dict[str, _Held] = {}
        instances = set(figures.nodes) | (set(self._held) if unanswered else set())
        for instance in sorted(instances):
            found = figures.nodes.get(instance) or NodeFound(instance)
            if found.used is not None or found.groups is not None or found.oom is not None:
                _bound(found)
            held = self._held.get(instance) or _Held()
            held_now[instance] = held
            if found.used is not None and found.fresh_at is not None:
                held.used, held.total, held.fresh_at = found.used, found.total, found.fresh_at
                held.ip = found.ip or held.ip
            age = None if held.fresh_at is None else max(0.0, reference - held.fresh_at)
            error = None
            if unanswered:
                error = (
                    f"Prometheus did not answer the {missing[0].name.lower()} query "
                    f"({printable(why_none)[:120]}); {_age_text(age)}"
                )
            elif found.down:
                error = f"Prometheus cannot scrape it (up 0); {_age_text(age)}"
            elif found.used is None or age is None:
                error = f"no node memory series in Prometheus; {_age_text(age)}"
            elif age > limit:
                error = (
                    f"{_age_text(age)}, over twice the {self.settings.scrape_interval_s:g} s "
                    "scrape interval"
                )
            node_id, host = names.get(instance, (instance, held.ip or instance))
            sampled_at = None if age is None else now - age
            carried = found.groups
            labels = (
                format_worker_groups(name for name, *_rest in carried.rows)
                if carried is not None and carried.rows
                else NO_WORKER_GROUPS
            )
            samples.append(
                NodeSample(
                    node_id=node_id,
                    host=host,
                    ip=held.ip,
                    used=held.used,
                    total=held.total,
                    worker_groups=labels,
                    sampled_at=sampled_at,
                    error=error,
                    metrics_url=f"http://{instance}/metrics",
                )
            )
            if error is None and sampled_at is not None:
                if carried is not None:
                    groups[node_id] = (host, carried, sampled_at)
                if found.oom is not None:
                    oom[node_id] = (host, found.oom, sampled_at)
        samples.sort(key=lambda sample: (sample.host, sample.node_id))
        with self._lock:
            self._held = held_now
            self._samples, self._groups, self._oom = samples, groups, oom

    # Reading --------------------------------------------------------------------------

    def latest(self) -> list[NodeSample]:
        """Every node of the latest cycle, failing ones included, sorted by host then id."""
        self._consumer = True
        with self._lock:
            return list(self._samples)

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        """Per node id: host, its freshest sampler's figures, and when (this clock); live
        nodes only."""
        with self._lock:
            return dict(self._groups)

    def oom_counts(self) -> dict[str, tuple[str, NodeOomCounts, float]]:
        """Per node id: host, its kill counters, and when (this clock); live nodes only."""
        with self._lock:
            return dict(self._oom)

    def query_errors(self) -> list[str]:
        """One printable line per query of the latest cycle that failed."""
        cycle = self.last_cycle
        if cycle is None:
            return []
        return [
            f"{query.name.lower()}: {printable(text)[:200]}" for query, text in cycle.errors.items()
        ]

    # A thread of its own, for a driver ----------------------------------------------

    def start(self) -> None:
        """Run a cycle every ``interval`` on a daemon thread until :meth:`stop`."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._loop, args=(self._stop,), name="raylens-prometheus-source", daemon=True
            )
            self._thread.start()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.collect_once()
            except Exception:  # noqa: BLE001 the source's thread never dies: the next cycle carries on
                warn_once(
                    "prometheus_source.cycle",
                    "a Prometheus-source cycle failed; the next one carries on",
                    logger=_LOGGER,
                )
            stop.wait(self.interval)

    def stop(self) -> None:
        """Stop the thread (within the queries' deadline), then run every ``on_stop``."""
        with self._lock:
            thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(self.settings.timeout_s + 1.0)
        self._hooks.run(self, stopping=True)
        with self._lock:
            self._samples, self._groups, self._oom = [], {}, {}
