"""What raylens reads from one raylet payload: the memory series, by exact name.

Pure and light: it imports only :mod:`raylens.telemetry.prometheus_text`, so the
scrape helper process parses payloads without importing lens or OpenTelemetry.
The keys it files values under are lens' registry keys of the exported series
(``rl.host.memory.used`` is filed as ``host_memory_used``); the error types are
the fixed set ``error.type`` may take.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from raylens.safe_text import encodable
from raylens.telemetry.prometheus_text import extract_labelled_samples, extract_samples

__all__ = [
    "COMPONENT_LABEL",
    "ERROR_CONNECTION",
    "ERROR_ENCODING",
    "ERROR_HTTP_STATUS",
    "ERROR_INTERNAL",
    "ERROR_NO_METRICS_PORT",
    "ERROR_PARSE",
    "ERROR_SERVER_ERROR",
    "ERROR_TIMEOUT",
    "ERROR_TOO_LARGE",
    "EVICTION_NAME_LABEL",
    "GROUP_GROWTH_GAUGE",
    "GROUP_LABEL",
    "GROUP_MEMORY_GAUGE",
    "GROUP_PROCESSES_GAUGE",
    "GROUP_PSS_AGE_GAUGE",
    "GROUP_SERIES",
    "MACHINE_TOTAL_KEY",
    "MACHINE_USED_KEY",
    "MAX_CLOCK_SKEW_S",
    "MAX_EVICTION_NAMES",
    "MAX_EVICTION_NAME_CHARS",
    "MAX_GROUPS_PER_NODE",
    "MEMORY_TYPE_LABEL",
    "NODE_GROWING_GAUGE",
    "NODE_GROWTH_GAUGE",
    "NODE_LIMIT_GAUGE",
    "NODE_OOM_KILLS_GAUGE",
    "NODE_SERIES",
    "NODE_TIME_TO_LIMIT_GAUGE",
    "NODE_USED_GAUGE",
    "OOM_SERIES",
    "OOM_SOURCE_LABEL",
    "OUTSIDE_GROWTH_GAUGE",
    "RAYLET_COMPONENT",
    "RAY_GROUP_GROWTH",
    "RAY_GROUP_MEMORY",
    "RAY_GROUP_PROCESSES",
    "RAY_GROUP_PSS_AGE",
    "RAY_NODE_MEM_TOTAL",
    "RAY_NODE_MEM_TOTAL_HOST",
    "RAY_NODE_MEM_USED",
    "RAY_NODE_MEM_USED_HOST",
    "RAY_NODE_OOM_KILLS",
    "RAY_SAMPLER_SAMPLED_AT",
    "RAY_WORKER_EVICTIONS",
    "RAY_WORKER_ID_LABEL",
    "SAMPLER_LABEL",
    "SAMPLER_SAMPLED_AT_GAUGE",
    "SAMPLER_WINDOW_GAUGE",
    "SCRAPE_ERROR_TYPES",
    "SERIES_BY_RAY_NAME",
    "STALE_AFTER_S",
    "STARTED_BY_LABEL",
    "TOTAL_KEY",
    "USED_KEY",
    "FigureRow",
    "GroupFigure",
    "NodeFigures",
    "NodeGroupFigures",
    "NodeOomCounts",
    "SamplerSeries",
    "TrustedSamplers",
    "parse_group_samples",
    "parse_memory_samples",
    "parse_oom_samples",
    "read_sampler_series",
]

RAY_NODE_MEM_USED = "ray_node_mem_used"
RAY_NODE_MEM_TOTAL = "ray_node_mem_total"
RAY_NODE_MEM_USED_HOST = "ray_node_mem_used_host"
RAY_NODE_MEM_TOTAL_HOST = "ray_node_mem_total_host"

#: Registry keys of ``rl.host.memory.used``/``.total`` and ``rl.host.machine.memory.*``.
USED_KEY = "host_memory_used"
TOTAL_KEY = "host_memory_total"
MACHINE_USED_KEY = "host_machine_memory_used"
MACHINE_TOTAL_KEY = "host_machine_memory_total"

#: The raylet series read from each payload, and the key each is filed under.
SERIES_BY_RAY_NAME: dict[str, str] = {
    RAY_NODE_MEM_USED: USED_KEY,
    RAY_NODE_MEM_TOTAL: TOTAL_KEY,
    RAY_NODE_MEM_USED_HOST: MACHINE_USED_KEY,
    RAY_NODE_MEM_TOTAL_HOST: MACHINE_TOTAL_KEY,
}

# Per-group memory, published by each node's sampler through Ray's own metrics pipeline
# (``ray.util.metrics`` in the sampler actor; the node's metrics agent serves the series on
# the endpoint scraped above, with Ray's ``ray_`` prefix and its own labels added).
#: The name a sampler gives its gauges; Ray serves them with the ``ray_`` prefix.
GROUP_MEMORY_GAUGE = "raylens_worker_group_memory_bytes"
GROUP_PROCESSES_GAUGE = "raylens_worker_group_processes"
SAMPLER_SAMPLED_AT_GAUGE = "raylens_sampler_sampled_at_seconds"
GROUP_GROWTH_GAUGE = "raylens_worker_group_memory_growth_bytes_per_second"
#: Seconds between the read of a group's PSS and the sampler reading that published it
#: (PSS is read less often than RSS: see the sampler's ``pss_interval_seconds``).
GROUP_PSS_AGE_GAUGE = "raylens_worker_group_pss_age_seconds"
RAY_GROUP_MEMORY = f"ray_{GROUP_MEMORY_GAUGE}"
RAY_GROUP_PROCESSES = f"ray_{GROUP_PROCESSES_GAUGE}"
RAY_SAMPLER_SAMPLED_AT = f"ray_{SAMPLER_SAMPLED_AT_GAUGE}"
RAY_GROUP_GROWTH = f"ray_{GROUP_GROWTH_GAUGE}"
RAY_GROUP_PSS_AGE = f"ray_{GROUP_PSS_AGE_GAUGE}"
# The node's own figures, set by the same sampler (see :class:`NodeFigures`).
NODE_USED_GAUGE = "raylens_node_memory_used_bytes"
NODE_GROWTH_GAUGE = "raylens_node_memory_growth_bytes_per_second"
OUTSIDE_GROWTH_GAUGE = "raylens_node_memory_outside_groups_growth_bytes_per_second"
NODE_GROWING_GAUGE = "raylens_node_memory_growing"
NODE_LIMIT_GAUGE = "raylens_node_memory_limit_bytes"
NODE_TIME_TO_LIMIT_GAUGE = "raylens_node_memory_time_to_limit_seconds"
#: Its value is the sampler's growth window; its labels say which sampler this is.
SAMPLER_WINDOW_GAUGE = "raylens_sampler_growth_window_seconds"
#: The node series as Ray serves them, in :class:`NodeFigures`' field order (window last).
NODE_SERIES = tuple(
    f"ray_{name}"
    for name in (
        NODE_USED_GAUGE,
        NODE_GROWTH_GAUGE,
        OUTSIDE_GROWTH_GAUGE,
        NODE_GROWING_GAUGE,
        NODE_LIMIT_GAUGE,
        NODE_TIME_TO_LIMIT_GAUGE,
        SAMPLER_WINDOW_GAUGE,
    )
)
#: Labels of the window series: the sampler's own id and the monitor that started it.
SAMPLER_LABEL = "rl_sampler"
STARTED_BY_LABEL = "rl_started_by"
#: Label keys on the group series: the group's name and ``rss`` or ``pss``.
GROUP_LABEL = "rl_worker_group"
MEMORY_TYPE_LABEL = "memory_type"
#: Ray's label telling apart the processes that report to one node's agent.
RAY_WORKER_ID_LABEL = "WorkerId"

#: Every value ``error.type`` may take: a fixed set, so the label's cardinality is bounded.
ERROR_TIMEOUT = "timeout"
ERROR_CONNECTION = "connection"
ERROR_HTTP_STATUS = "http_status"
#: The endpoint answered 5xx: Ray's metrics agent under load answers 500 and is asked
#: again next cycle, so it is told apart from a wrong endpoint (404 and other statuses).
ERROR_SERVER_ERROR = "server_error"
ERROR_TOO_LARGE = "too_large"
ERROR_ENCODING = "encoding"
ERROR_PARSE = "parse"
ERROR_NO_METRICS_PORT = "no_metrics_port"
#: The scraper itself failed (the helper process died, a replaced ``_scrape`` raised).
ERROR_INTERNAL = "internal"
SCRAPE_ERROR_TYPES = frozenset(
    {
        ERROR_TIMEOUT,
        ERROR_CONNECTION,
        ERROR_HTTP_STATUS,
        ERROR_SERVER_ERROR,
        ERROR_TOO_LARGE,
        ERROR_ENCODING,
        ERROR_PARSE,
        ERROR_NO_METRICS_PORT,
        ERROR_INTERNAL,
    }
)


def parse_memory_samples(metrics_text: str | bytes) -> dict[str, float]:
    """``{key: bytes}`` for the memory series found in one raylet payload.

    Four series are read by exact name in one pass: Ray's own figure
    (``ray_node_mem_used``/``ray_node_mem_total``: the cgroup's usage and limit
    when the raylet runs in a container, which is what Ray's memory monitor acts
    on) and the physical machine's (``ray_node_mem_used_host``/
    ``ray_node_mem_total_host``, which only recent raylets publish). Nothing else
    in the payload is parsed. A series that is missing or has no usable value
    (NaN, infinite, negative) is absent from the result.
    """
    samples = extract_samples(metrics_text, SERIES_BY_RAY_NAME)
    return {key: samples[name] for name, key in SERIES_BY_RAY_NAME.items() if name in samples}


#: The per-group series a scrape keeps, besides :data:`SERIES_BY_RAY_NAME`.
GROUP_SERIES = (
    RAY_GROUP_MEMORY,
    RAY_GROUP_PROCESSES,
    RAY_SAMPLER_SAMPLED_AT,
    RAY_GROUP_GROWTH,
    RAY_GROUP_PSS_AGE,
    *NODE_SERIES,
)
#: The samplers a reader believes: sampler id (a Ray actor id) to the Ray worker id its
#: series must carry (``""`` while that is not known yet).
TrustedSamplers = Mapping[str, str]
#: Most groups read from one node's payload; the rest are dropped, in name order.
MAX_GROUPS_PER_NODE = 256
#: Most samplers a payload's refusals name (all are counted).
_REFUSALS_NAMED = 8


class GroupFigure(NamedTuple):
    """One worker group's memory on one node, as its sampler last published it."""

    group: str
    rss_bytes: float
    pss_bytes: float | None
    process_count: float | None
    #: Bytes per second over the sampler's growth window; None until the window is full,
    #: and while the group shrinks (the exposition's reader drops negative values).
    growth: float | None = None
    #: How old ``pss_bytes`` was at the sampler's reading, in seconds; None where the
    #: sampler does not say (then PSS counts as read with RSS).
    pss_age_s: float | None = None


class NodeFigures(NamedTuple):
    """What a node's sampler publishes about the node itself, besides its groups.

    ``used`` is the node's used memory as Ray's memory monitor counts it, read by the
    sampler; ``growth`` and ``outside_growth`` (the memory outside every group) are bytes
    per second over its window, None until the window is full (and while shrinking: the
    exposition's reader drops negative values); ``limit`` is the node's kill line and
    ``time_to_limit`` the seconds left to it, only while ``growing``. ``window_s``,
    ``sampler`` and ``started_by`` say which sampler published and over what window;
    ``stale_for`` is set when that sampler has stopped publishing.
    """

    used: float | None
    growth: float | None
    outside_growth: float | None
    growing: bool
    limit: float | None
    time_to_limit: float | None
    window_s: float
    sampler: str
    started_by: str
    #: Seconds the sampler's stamp had stood still when it was read, when that is more
    #: than :data:`STALE_AFTER_S`; None while it publishes.
    stale_for: float | None = None


#: One group's figures as a plain tuple, in :class:`GroupFigure`'s field order.
FigureRow = tuple[str, float, float | None, float | None, float | None, float | None]


class NodeGroupFigures:
    """What one node's sampler last published: when (its wall clock) and per group, by name.

    Built and compared as ``NodeGroupFigures(sampled_at, groups, node)``, and immutable;
    :attr:`node` holds the node's own figures (None from a sampler that publishes none). The
    groups are held as plain tuples (:attr:`rows`, in :class:`GroupFigure`'s field order),
    which the garbage collector stops tracking: a driver holds one such reading per node,
    and every object that outlives its cycles brings the collector's full passes sooner.
    :attr:`groups` gives them as :class:`GroupFigure`, built when asked.
    """

    __slots__ = ("node", "rows", "sampled_at")

    rows: tuple[FigureRow, ...]
    sampled_at: float
    node: NodeFigures | None

    def __init__(
        self,
        sampled_at: float,
        groups: Iterable[GroupFigure],
        node: NodeFigures | None = None,
    ) -> None:
        rows = tuple([tuple(GroupFigure(*figure)) for figure in groups])
        object.__setattr__(self, "sampled_at", sampled_at)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "node", node)

    @classmethod
    def from_rows(
        cls, sampled_at: float, rows: tuple[FigureRow, ...], node: NodeFigures | None = None
    ) -> NodeGroupFigures:
        """Figures from ``rows`` already shaped as :attr:`rows` (six values per group)."""
        figures = object.__new__(cls)
        object.__setattr__(figures, "sampled_at", sampled_at)
        object.__setattr__(figures, "rows", rows)
        object.__setattr__(figures, "node", node)
        return figures

    @property
    def groups(self) -> tuple[GroupFigure, ...]:
        """Per group, its figures."""
        return tuple([GroupFigure._make(row) for row in self.rows])

    def _replace(
        self, *, sampled_at: float | None = None, groups: Iterable[GroupFigure] | None = None
    ) -> NodeGroupFigures:
        """A copy with ``sampled_at`` and/or ``groups`` replaced."""
        stamp = self.sampled_at if sampled_at is None else sampled_at
        if groups is None:
            return NodeGroupFigures.from_rows(stamp, self.rows, self.node)
        return NodeGroupFigures(stamp, groups, self.node)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"NodeGroupFigures is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"NodeGroupFigures is immutable; cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeGroupFigures):
            return NotImplemented
        return (
            self.sampled_at == other.sampled_at
            and self.rows == other.rows
            and self.node == other.node
        )

    def __hash__(self) -> int:
        return hash((self.sampled_at, self.rows, self.node))

    def __reduce__(self) -> tuple[Any, ...]:
        return (NodeGroupFigures.from_rows, (self.sampled_at, self.rows, self.node))

    def __repr__(self) -> str:
        return (
            f"NodeGroupFigures(sampled_at={self.sampled_at!r}, groups={self.groups!r}, "
            f"node={self.node!r})"
        )


#: How far ahead of the reader's clock a sampler's stamp may be (clocks of two machines
#: differ); a stamp further ahead is refused with everything its sampler published.
MAX_CLOCK_SKEW_S = 30.0
#: A sampler whose stamp is this much older than the reader's clock has stopped publishing:
#: its figures are left out where another monitor's sampler is fresh, and marked stale
#: (:attr:`NodeFigures.stale_for`) where none is.
STALE_AFTER_S = 60.0


class SamplerSeries(NamedTuple):
    """What :func:`read_sampler_series` made of one payload: the figures believed, and why
    the rest were not.

    ``refused`` names the samplers left out (their stamp, or their identity, as plain text
    still to be escaped for display); ``refused_count`` counts them all, ``unknown`` those
    whose identity is not a known sampler's.
    """

    figures: NodeGroupFigures | None
    refused: tuple[str, ...] = ()
    refused_count: int = 0
    unknown: int = 0


class _Candidate:
    """One publishing process's sampler series (Ray's ``WorkerId`` tells them apart)."""

    __slots__ = ("growth", "identity", "node", "processes", "pss", "pss_age", "rss", "stamp")

    def __init__(self) -> None:
        self.stamp: float | None = None
        self.identity = ("", "")
        self.node: dict[str, float] = {}
        self.rss: dict[str, float] = {}
        self.pss: dict[str, float] = {}
        self.processes: dict[str, float] = {}
        self.growth: dict[str, float] = {}
        self.pss_age: dict[str, float] = {}

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        if name == RAY_SAMPLER_SAMPLED_AT:
            self.stamp = value
            return
        if name in _NODE_NAMES:
            self.node[name] = value
            if name == _RAY_SAMPLER_WINDOW:
                self.identity = (
                    encodable(labels.get(SAMPLER_LABEL, "")),
                    encodable(labels.get(STARTED_BY_LABEL, "")),
                )
            return
        group = labels.get(GROUP_LABEL)
        if group is None:
            return
        group = encodable(group)
        if name == RAY_GROUP_PROCESSES:
            self.processes[group] = value
        elif name == RAY_GROUP_GROWTH:
            self.growth[group] = value
        elif name == RAY_GROUP_PSS_AGE:
            self.pss_age[group] = value
        elif name == RAY_GROUP_MEMORY:
            kind = labels.get(MEMORY_TYPE_LABEL)
            if kind == "rss":
                self.rss[group] = value
            elif kind == "pss":
                self.pss[group] = value

    def figure(self, group: str) -> GroupFigure:
        pss = self.pss.get(group)
        return GroupFigure(
            group,
            self.rss[group],
            pss,
            self.processes.get(group),
            self.growth.get(group),
            None if pss is None else self.pss_age.get(group),
        )


def parse_group_samples(
    metrics_text: str | bytes,
    *,
    now: float | None = None,
    trusted: TrustedSamplers | None = None,
) -> NodeGroupFigures | None:
    """The per-group figures one node's payload carries, or None when it carries none
    (see :func:`read_sampler_series`, which also says what it left out)."""
    return read_sampler_series(metrics_text, now=now, trusted=trusted).figures


def read_sampler_series(
    metrics_text: str | bytes,
    *,
    now: float | None = None,
    trusted: TrustedSamplers | None = None,
) -> SamplerSeries:
    """The figures of the samplers publishing on one node, as one reading.

    Series are grouped by the process that published them (Ray's ``WorkerId``). A
    process's series count only if it publishes a stamp and, when ``trusted`` is given,
    names in its window series a sampler id that ``trusted`` holds, under the Ray worker id
    ``trusted`` gives it where it gives one (any job can publish under raylens' names, and
    copy a sampler's id into its labels, but Ray stamps every series with the worker that
    set it). With ``now`` (the
    reader's Unix time), a stamp more than :data:`MAX_CLOCK_SKEW_S` ahead of it is
    refused. Of the samplers one monitor started (its ``started_by``), only the freshest
    counts: Ray serves a replaced sampler's last values for a while. The node's figures
    are the union of the rest: per group, the freshest sampler publishing it, so each
    driver on a cluster sees every driver's groups; the node's own figures come from the
    freshest sampler publishing them. With ``now``, samplers whose stamp is over
    :data:`STALE_AFTER_S` old are left out while another is fresh; where none is, their
    node figures say for how long they have been stale. A group whose value is NaN (what
    a sampler publishes for a group that left) is absent, as is a group without an RSS
    figure. Group names are made encodable here, where they enter raylens.
    """
    candidates: dict[str, _Candidate] = {}
    for sample in extract_labelled_samples(metrics_text, GROUP_SERIES):
        labels = dict(sample.labels)
        worker = labels.get(RAY_WORKER_ID_LABEL, "")
        candidate = candidates.get(worker)
        if candidate is None:
            candidate = candidates[worker] = _Candidate()
        candidate.add(sample.name, labels, sample.value)
    refused: list[str] = []
    count = unknown = 0
    newest: dict[str, _Candidate] = {}
    for worker, candidate in candidates.items():
        stamp = candidate.stamp
        if stamp is None:
            continue
        sampler, started_by = candidate.identity
        if now is not None and stamp > now + MAX_CLOCK_SKEW_S:
            count += 1
            why = f"{stamp - now:.3g} s ahead of this reader's clock"
            refused.append(f"{RAY_SAMPLER_SAMPLED_AT}={stamp:.6g} ({why})")
            continue
        if trusted is not None and (
            not sampler or sampler not in trusted or trusted[sampler] not in ("", worker)
        ):
            count += 1
            unknown += 1
            why = "unknown" if sampler not in trusted else "not its worker"
            refused.append(f"{_RAY_SAMPLER_WINDOW}{{{SAMPLER_LABEL}={sampler[:80]!r}}} ({why})")
            continue
        held = newest.get(started_by)
        if held is None or (held.stamp or 0.0) < stamp:
            newest[started_by] = candidate
    chosen = sorted(newest.values(), key=lambda c: c.stamp or 0.0, reverse=True)
    if now is not None:
        fresh = [c for c in chosen if now - (c.stamp or 0.0) <= STALE_AFTER_S]
        chosen = fresh or chosen
    named = tuple(refused[:_REFUSALS_NAMED])
    if not chosen:
        return SamplerSeries(None, named, count, unknown)
    rows: dict[str, GroupFigure] = {}
    node: NodeFigures | None = None
    for candidate in chosen:
        for group in candidate.rss:
            if group not in rows:
                rows[group] = candidate.figure(group)
        if node is None:
            node = _node_figures(candidate.node, candidate.identity)
            if node is not None and now is not None:
                age = now - (candidate.stamp or 0.0)
                if age > STALE_AFTER_S:
                    node = node._replace(stale_for=age)
    groups = tuple(rows[name] for name in sorted(rows)[:MAX_GROUPS_PER_NODE])
    return SamplerSeries(
        NodeGroupFigures(chosen[0].stamp or 0.0, groups, node), named, count, unknown
    )


_NODE_NAMES = frozenset(NODE_SERIES)
_RAY_SAMPLER_WINDOW = NODE_SERIES[-1]


def _node_figures(values: dict[str, float], identity: tuple[str, str]) -> NodeFigures | None:
    """The node's figures from its sampler's series, None without its window series."""
    window = values.get(_RAY_SAMPLER_WINDOW)
    if window is None:
        return None
    used, growth, outside, growing, limit, left = (values.get(name) for name in NODE_SERIES[:-1])
    return NodeFigures(
        used, growth, outside, bool(growing), limit, left, window, identity[0], identity[1]
    )


# Workers lost to memory. Ray's memory monitor counts its kills in the raylet's own
# counter (one series per ``Type`` and ``Name``: the victim's task or actor, ``<actor
# name>:<Class>.<method>`` for a named actor); the kernel's OOM killer is counted by
# each node's sampler, which publishes the node's count (the container's
# ``memory.events`` ``oom_kill``, else ``/proc/vmstat``'s) as a gauge.
#
# Any worker can publish a series under the counter's name through ``ray.util.metrics``.
# Ray's agent stamps every series with the process it came from: the raylet's carry
# ``Component="raylet"`` and an empty ``WorkerId``, a worker's carry
# ``Component="core_worker"`` and its worker id, whatever labels the worker chose (Ray
# 2.60 overrides a ``Component`` a worker sets itself). Only the raylet's series count.
#: The raylet's counter of workers its memory monitor killed.
RAY_WORKER_EVICTIONS = "ray_memory_manager_worker_eviction_total"
#: The name a sampler gives its gauge of the kernel's OOM kills on its node.
NODE_OOM_KILLS_GAUGE = "raylens_node_oom_kills"
RAY_NODE_OOM_KILLS = f"ray_{NODE_OOM_KILLS_GAUGE}"
#: Label on the kernel's count: where it was read (``cgroup`` or ``vmstat``).
OOM_SOURCE_LABEL = "oom_source"
#: The kill counters a scrape keeps.
OOM_SERIES = (RAY_WORKER_EVICTIONS, RAY_NODE_OOM_KILLS)
#: Label Ray's agent puts on every series: the process that published it.
COMPONENT_LABEL = "Component"
#: ``Component`` of the series the raylet itself publishes.
RAYLET_COMPONENT = "raylet"
#: Label of the eviction counter naming the victim's task or actor.
EVICTION_NAME_LABEL = "Name"
#: Most victim names one node's counts keep (the rest are summed under ``""``).
MAX_EVICTION_NAMES = 64
#: Longest victim name kept, in characters.
MAX_EVICTION_NAME_CHARS = 200


class NodeOomCounts(NamedTuple):
    """A node's kill counters as one scrape found them; None where the payload has none.

    ``ray_evictions`` sums the raylet's own series of Ray's eviction counter (a series a
    worker published under that name is not one); ``ray_victims`` is that sum per victim
    name, ``(name, count)`` sorted by name, at most :data:`MAX_EVICTION_NAMES` of them
    (the rest summed under the name ``""``); ``kernel_oom_kills`` is the largest count
    any sampler on the node published (all read the same kernel figure, so a replaced
    sampler's stale series cannot lower it).
    """

    ray_evictions: float | None
    kernel_oom_kills: float | None
    ray_victims: tuple[tuple[str, float], ...] = ()


def _from_raylet(labels: dict[str, str]) -> bool:
    return labels.get(COMPONENT_LABEL) == RAYLET_COMPONENT and not labels.get(RAY_WORKER_ID_LABEL)


def parse_oom_samples(metrics_text: str | bytes) -> NodeOomCounts | None:
    """The kill counters one node's payload carries, or None when it carries neither.

    A value that is not finite or is negative is not a sample (the extractor drops it).
    """
    samples = extract_labelled_samples(metrics_text, OOM_SERIES)
    evictions: float | None = None
    kernel: float | None = None
    by_name: dict[str, float] = {}
    for sample in samples:
        if sample.name == RAY_WORKER_EVICTIONS:
            labels = dict(sample.labels)
            if not _from_raylet(labels):
                continue
            evictions = (evictions or 0.0) + sample.value
            name = encodable(labels.get(EVICTION_NAME_LABEL, ""))[:MAX_EVICTION_NAME_CHARS]
            by_name[name] = by_name.get(name, 0.0) + sample.value
        elif kernel is None or sample.value > kernel:
            kernel = sample.value
    if evictions is None and kernel is None:
        return None
    names = sorted(by_name.items())
    if len(names) > MAX_EVICTION_NAMES:
        kept = [item for item in names if item[0]][: MAX_EVICTION_NAMES - 1]
        rest = sum(value for name, value in names) - sum(value for _, value in kept)
        names = [("", rest), *kept]
    return NodeOomCounts(evictions, kernel, tuple(names))
