"""Where a node's sampler publishes: the publisher seam and its Ray default.

:class:`GroupMemoryPublisher` and the optional protocols beside it are what a sampler's
loop hands each reading to; :class:`RayMetricsPublisher` sets ``ray.util.metrics`` gauges
(the series named in :mod:`raylens.telemetry.raylet_payload`) that the node's metrics
agent serves on the endpoint the host-memory scrape reads. Gauges are made on first use,
inside the sampler's process, never at import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from raylens.telemetry.growth import NodeReading
from raylens.telemetry.raylet_payload import (
    GROUP_GROWTH_GAUGE,
    GROUP_LABEL,
    GROUP_MEMORY_GAUGE,
    GROUP_PROCESSES_GAUGE,
    GROUP_PSS_AGE_GAUGE,
    MEMORY_TYPE_LABEL,
    NODE_GROWING_GAUGE,
    NODE_GROWTH_GAUGE,
    NODE_LIMIT_GAUGE,
    NODE_OOM_KILLS_GAUGE,
    NODE_TIME_TO_LIMIT_GAUGE,
    NODE_USED_GAUGE,
    OOM_SOURCE_LABEL,
    OUTSIDE_GROWTH_GAUGE,
    SAMPLER_LABEL,
    SAMPLER_SAMPLED_AT_GAUGE,
    SAMPLER_WINDOW_GAUGE,
    STARTED_BY_LABEL,
)

__all__ = [
    "GroupMemoryPublisher",
    "GrowthPublisher",
    "KernelOomPublisher",
    "NodeGrowthPublisher",
    "PssAgePublisher",
    "RayMetricsPublisher",
]

_NAN = float("nan")
_RSS = "rss"
_PSS = "pss"


class GroupMemoryPublisher(Protocol):
    """Where a sampler's readings go: one call per group per reading, then the time."""

    def set_group(self, group: str, rss_bytes: int, pss_bytes: int | None, processes: int) -> None:
        """Publish one group's figures; ``pss_bytes`` None means PSS is not known now."""

    def forget_group(self, group: str) -> None:
        """The group is no longer on this node: mark its series gone (NaN)."""

    def set_sampled_at(self, seconds: float) -> None:
        """The wall-clock time of the reading just published."""


@runtime_checkable
class KernelOomPublisher(Protocol):
    """A publisher that also takes the kernel's OOM-kill count on the node."""

    def set_kernel_oom_kills(self, kills: int, source: str) -> None:
        """Publish the count (cumulative) and where it was read (``cgroup`` or ``vmstat``)."""


@runtime_checkable
class GrowthPublisher(Protocol):
    """A publisher that also takes each group's growth rate, where the sampler knows one."""

    def set_growth(self, group: str, bytes_per_second: float) -> None:
        """Publish the group's growth (bytes per second) over the sampler's window."""


@runtime_checkable
class PssAgePublisher(Protocol):
    """A publisher that also takes how old each group's PSS figure is."""

    def set_pss_age(self, group: str, seconds: float | None) -> None:
        """Publish the age of the group's PSS at this reading (None: no PSS is known)."""


@runtime_checkable
class NodeGrowthPublisher(Protocol):
    """A publisher that also takes the node's own figures after each reading."""

    def set_node(self, reading: NodeReading | None, window_s: float) -> None:
        """Publish the node's figures (None: the node's memory could not be read)."""


def _ray_gauge_class() -> Any:
    from ray.util.metrics import Gauge

    return Gauge


class RayMetricsPublisher:
    """Publishes through ``ray.util.metrics`` gauges, made on the first call.

    ``gauge_class`` stands in for ``ray.util.metrics.Gauge`` (imported on first use
    when None): anything taking ``(name, description=..., tag_keys=...)`` whose
    instances have ``set(value, tags=...)``. Not thread-safe; one loop calls it.
    """

    def __init__(
        self,
        gauge_class: Callable[..., Any] | None = None,
        *,
        sampler: str = "",
        started_by: str = "",
    ) -> None:
        self._gauge_class = gauge_class
        self._identity = {SAMPLER_LABEL: sampler, STARTED_BY_LABEL: started_by}
        self._gauges: tuple[Any, Any, Any, Any, Any] | None = None
        self._node_gauges: tuple[Any, ...] | None = None
        # Groups whose PSS series holds a number, so a PSS that stops being known gets NaN;
        # the same for the series of its age.
        self._with_pss: set[str] = set()
        self._with_pss_age: set[str] = set()
        self._oom_gauge: Any = None

    def _made(self) -> tuple[Any, Any, Any, Any, Any]:
        if self._gauges is None:
            gauge = self._gauge_class or _ray_gauge_class()
            self._gauges = (
                gauge(
                    GROUP_MEMORY_GAUGE,
                    description="Memory of a worker group's process trees on this node, in "
                    "bytes, by memory_type (rss or pss), read by raylens' sampler.",
                    tag_keys=(GROUP_LABEL, MEMORY_TYPE_LABEL),
                ),
                gauge(
                    GROUP_PROCESSES_GAUGE,
                    description="Processes in a worker group's process trees on this node.",
                    tag_keys=(GROUP_LABEL,),
                ),
                gauge(
                    SAMPLER_SAMPLED_AT_GAUGE,
                    description="Unix time of raylens' sampler's latest reading on this node.",
                    tag_keys=(),
                ),
                gauge(
                    GROUP_GROWTH_GAUGE,
                    description="Growth of a worker group's RSS on this node, in bytes per "
                    "second, over raylens' growth window; absent until the window is full.",
                    tag_keys=(GROUP_LABEL,),
                ),
                gauge(
                    GROUP_PSS_AGE_GAUGE,
                    description="How old a worker group's PSS figure on this node was at "
                    "raylens' sampler's latest reading, in seconds (PSS is read less often "
                    "than RSS).",
                    tag_keys=(GROUP_LABEL,),
                ),
            )
        return self._gauges

    def set_group(self, group: str, rss_bytes: int, pss_bytes: int | None, processes: int) -> None:
        memory, counts, *_ = self._made()
        memory.set(float(rss_bytes), tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _RSS})
        if pss_bytes is not None:
            memory.set(float(pss_bytes), tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _PSS})
            self._with_pss.add(group)
        elif group in self._with_pss:
            memory.set(_NAN, tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _PSS})
            self._with_pss.discard(group)
        counts.set(float(processes), tags={GROUP_LABEL: group})

    def forget_group(self, group: str) -> None:
        memory, counts, _, growth, _ = self._made()
        growth.set(_NAN, tags={GROUP_LABEL: group})
        self.set_pss_age(group, None)
        memory.set(_NAN, tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _RSS})
        if group in self._with_pss:
            memory.set(_NAN, tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _PSS})
            self._with_pss.discard(group)
        counts.set(_NAN, tags={GROUP_LABEL: group})

    def set_sampled_at(self, seconds: float) -> None:
        self._made()[2].set(float(seconds))

    def set_growth(self, group: str, bytes_per_second: float) -> None:
        self._made()[3].set(float(bytes_per_second), tags={GROUP_LABEL: group})

    def set_pss_age(self, group: str, seconds: float | None) -> None:
        if seconds is not None:
            self._made()[4].set(float(seconds), tags={GROUP_LABEL: group})
            self._with_pss_age.add(group)
        elif group in self._with_pss_age:
            self._made()[4].set(_NAN, tags={GROUP_LABEL: group})
            self._with_pss_age.discard(group)

    def _node_made(self) -> tuple[Any, ...]:
        if self._node_gauges is None:
            gauge = self._gauge_class or _ray_gauge_class()
            self._node_gauges = (
                *tuple(
                    gauge(name, description=description, tag_keys=())
                    for name, description in _NODE_GAUGES
                ),
                gauge(
                    SAMPLER_WINDOW_GAUGE,
                    description="The growth window of raylens' sampler on this node, in "
                    "seconds; its labels name the sampler and the monitor that started it.",
                    tag_keys=(SAMPLER_LABEL, STARTED_BY_LABEL),
                ),
            )
        return self._node_gauges

    def set_node(self, reading: NodeReading | None, window_s: float) -> None:
        *figures, window = self._node_made()
        values: tuple[float | None, ...] = (None,) * len(figures)
        if reading is not None:
            values = (
                reading.used,
                reading.growth,
                reading.outside_growth,
                1.0 if reading.growing else 0.0,
                reading.limit,
                reading.time_to_limit,
            )
        for gauge, value in zip(figures, values):
            gauge.set(_NAN if value is None else float(value))
        window.set(float(window_s), tags=self._identity)

    def set_kernel_oom_kills(self, kills: int, source: str) -> None:
        if self._oom_gauge is None:
            self._oom_gauge = (self._gauge_class or _ray_gauge_class())(
                NODE_OOM_KILLS_GAUGE,
                description="The kernel's OOM kills counted where this node runs (its "
                "container's memory.events, else /proc/vmstat), read by raylens' sampler.",
                tag_keys=(OOM_SOURCE_LABEL,),
            )
        self._oom_gauge.set(float(kills), tags={OOM_SOURCE_LABEL: source})


_NODE_GAUGES = (
    (
        NODE_USED_GAUGE,
        "Used memory of this node as Ray's memory monitor counts it, in bytes, "
        "read by raylens' sampler.",
    ),
    (
        NODE_GROWTH_GAUGE,
        "Growth of this node's used memory, in bytes per second, over "
        "raylens' growth window; NaN until the window is full.",
    ),
    (
        OUTSIDE_GROWTH_GAUGE,
        "Growth of this node's memory outside every worker group, in "
        "bytes per second, over raylens' growth window.",
    ),
    (NODE_GROWING_GAUGE, "1 while raylens judges this node's memory to be growing, else 0."),
    (
        NODE_LIMIT_GAUGE,
        "This node's kill line in bytes: min(host, container) total times "
        "Ray's memory-monitor threshold.",
    ),
    (
        NODE_TIME_TO_LIMIT_GAUGE,
        "Seconds until this node reaches its kill line at its "
        "current growth; NaN while it is not growing.",
    ),
)
