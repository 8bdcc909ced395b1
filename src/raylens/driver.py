"""Telemetry for a Ray driver: lens plus the host-memory monitor, and never an exception.

The driver is where worker groups are built, so the placement map that labels nodes
with their groups lives there, and so must the monitor that reads it; the groups'
worker processes are registered there too, and sampled at every monitor cycle
(:mod:`raylens.distributed.group_memory_cycle`). This module starts all of it,
above lens (lens knows nothing of the monitors built on it), and stops the monitor
through a lens shutdown hook when :func:`raylens.lens.shutdown_telemetry` runs.

Telemetry must not take a training job down: a malformed ``OTEL_*``/``RAYLENS_*``
variable, a Prometheus port already in use or a missing exporter package is logged
as one error naming the cause, and the driver carries on without that exporter.
Callers who want such problems to raise validate with
:meth:`raylens.lens.TelemetryConfig.from_env` first.

With ``RAYLENS_EXPORTER=console`` and no ``OTEL_METRIC_EXPORT_INTERVAL``, the driver
prints every :data:`DRIVER_CONSOLE_INTERVAL_MS` milliseconds rather than the SDK's
minute, so that a short run shows its points while its worker groups still exist.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar, cast

from opentelemetry.sdk.metrics.export import MetricReader

from raylens.cluster import (
    RayClusterView,
    connected_system_config,
    default_cluster_view,
    ray_call_errors,
)
from raylens.lens import (
    TelemetryConfig,
    TelemetryHandle,
    add_shutdown_hook,
    init_telemetry,
    warn_once,
)
from raylens.telemetry import host_memory
from raylens.telemetry.growth import (
    DEFAULT_GROWTH_WINDOW_S,
    DEFAULT_SAMPLE_INTERVAL_S,
    GrowthSettings,
    check_growth_window,
    growth_window_for_sampling,
    resolve_kill_line_config,
)
from raylens.telemetry.growth_outlook import GrowthCycle, attach_growth
from raylens.telemetry.memory_record import Frame, MemoryRecorder, NodeFrame
from raylens.telemetry.oom import OomWatch, PostMortemWriter, attach_oom_watch

if TYPE_CHECKING:
    from raylens.distributed.group_memory_cycle import GroupMemoryCycle

__all__ = [
    "DRIVER_CONSOLE_INTERVAL_MS",
    "SOURCES",
    "driver_config_from_env",
    "init_telemetry_driver",
]

logger = logging.getLogger("raylens.driver")

DRIVER_CONSOLE_INTERVAL_MS = 5_000
#: Where the driver reads the nodes' figures: from every node, or from a Prometheus.
SOURCES = ("nodes", "prometheus")


def driver_config_from_env(environ: Mapping[str, str] | None = None) -> TelemetryConfig:
    """:meth:`TelemetryConfig.from_env` with the driver's console default; raises the same errors."""
    env = os.environ if environ is None else environ
    config = TelemetryConfig.from_env(env)
    interval_set = bool(env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip())
    if config.exporter == "console" and not interval_set:
        config = dataclasses.replace(config, export_interval_ms=DRIVER_CONSOLE_INTERVAL_MS)
    return config


def _start_lens(
    config: TelemetryConfig | None, metric_reader: MetricReader | None
) -> TelemetryHandle:
    if config is None:
        try:
            config = driver_config_from_env()
        except ValueError as error:
            logger.error("raylens telemetry is not exporting: %s", error)
            config = TelemetryConfig(exporter="none")
    chosen = config

    def report(error: Exception) -> None:
        logger.error(
            "raylens telemetry could not start the %s exporter and is not exporting: %s",
            chosen.exporter,
            error,
        )

    # An exporter's set-up is the SDK's or a plug-in's code.
    handle = _guarded(lambda: init_telemetry(chosen, metric_reader=metric_reader), report)
    if handle is not None:
        return handle
    return init_telemetry(dataclasses.replace(chosen, exporter="none"))


def init_telemetry_driver(
    config: TelemetryConfig | None = None,
    *,
    metric_reader: MetricReader | None = None,
    host_memory_interval: float | None = None,
    growth_window: float | None = None,
    kernel_peaks: bool | None = None,
    phase_log: str | os.PathLike[str] | None = None,
    record: str | os.PathLike[str] | None = None,
    source: str = "nodes",
    prometheus_url: str | None = None,
) -> TelemetryHandle:
    """Start telemetry in the driver, host-memory monitoring included. Never raises.

    ``config`` defaults to the environment (see the module docstring for the
    console interval). ``metric_reader`` replaces the configured exporter, as in
    :func:`raylens.lens.init_telemetry`. ``host_memory_interval`` is in seconds and
    defaults to the host-memory module's fallback interval. The monitor stops at
    the next :func:`raylens.lens.shutdown_telemetry`.

    Each monitor cycle also reads the memory of every registered worker group's
    processes on their nodes (``rl.worker_group.memory.usage``): worker groups
    register themselves, and each node's sampler reads their processes there.

    Every node scraped gets a sampler, which reads the node every second and computes
    its growth there; each cycle exports what the nodes published
    (``rl.host.memory.growth``, ``rl.worker_group.memory.growth``,
    ``rl.host.memory.limit``, ``rl.host.memory.time_to_limit``). ``growth_window`` is
    the samplers' sliding window in seconds; it defaults to ``RAYLENS_GROWTH_WINDOW``,
    else 300. A bad window (one shorter than 40 readings included) is logged in one
    line naming the shortest allowed, and the default used.

    Phases marked with :func:`raylens.phase` are exported
    (``rl.worker_group.memory.phase_peak``, ``rl.worker_group.memory.phase_delta``).
    ``kernel_peaks`` turns the kernel's peaks (``clear_refs`` and ``VmHWM``) on or off
    (default ``RAYLENS_KERNEL_PEAKS``, else on); ``phase_log`` names a file that gets one
    JSON line per phase (default ``RAYLENS_PHASE_LOG``, else none). A bad one is logged and
    the default used.

    ``record`` names a file that gets one JSON line per monitor cycle: every node's used
    memory and kill line, each group's memory there, the phase in progress and new OOM
    kills (bounded: a full file moves to ``<record>.1``). ``raylens plot`` draws it. A
    path that cannot be written is logged once and the driver goes on.

    ``source="prometheus"`` reads the nodes' figures from the Prometheus that scrapes the
    cluster (``prometheus_url``, else ``RAYLENS_PROMETHEUS_URL``; credentials and the rest
    from ``RAYLENS_PROMETHEUS_*``) instead of scraping every node: the samplers, growth,
    group memory, post-mortems and phases work as above, but ``rl.host.memory.used``,
    ``.total`` and the ``rl.host.scrape.*`` series are not exported, since that Prometheus
    already holds the same figures as ``ray_node_mem_used``/``_total`` and ``up``. A bad
    source or URL is logged and the nodes are scraped instead.

    Each cycle also looks for workers lost to memory (Ray's memory monitor, the
    kernel's OOM killer, a worker group's call failing with ``OutOfMemoryError``) and
    writes one post-mortem per kill event into ``RAYLENS_POSTMORTEM_DIR`` (default
    ``<temp dir>/raylens-postmortems-<uid>``, private), counted in ``rl.host.oom_kills``;
    a post-mortem names the phase the kill happened in. A sampler is started at once on
    every live node of the connected cluster, before any worker group exists, so that
    Ray's memory monitor kills it last: call this after ``ray.init``.
    """
    handle = _start_lens(config, metric_reader)
    interval = (
        host_memory.FALLBACK_COLLECTION_INTERVAL
        if host_memory_interval is None
        else host_memory_interval
    )
    if source == "prometheus" or source not in SOURCES:
        if source not in SOURCES:
            logger.error("raylens: source %r is not one of %s; scraping the nodes", source, SOURCES)
        elif _start_prometheus_source(prometheus_url, interval, growth_window):
            _attach_phases(kernel_peaks, phase_log)
            return handle
    monitor = host_memory.start_host_memory_monitoring(interval)
    if monitor is not None:
        groups = _attach_group_memory(monitor)
        growth = _attach_growth(monitor, growth_window, groups)
        kills = _attach_postmortems(monitor, growth, groups)
        if record is not None:
            _attach_record(monitor, record, growth, kills)
    _attach_phases(kernel_peaks, phase_log)
    add_shutdown_hook(host_memory.stop_host_memory_monitoring)
    return handle


def _start_prometheus_source(url: str | None, interval: float, window: float | None) -> bool:
    """Read the figures from Prometheus, with the node-mode hooks; False when it cannot."""
    from raylens.telemetry.prometheus_source import PrometheusSettings, PrometheusSource

    try:
        settings = PrometheusSettings.from_env(url=url)
        reader = PrometheusSource(settings, interval=interval, cluster=default_cluster_view())
    except ValueError as error:
        logger.error("raylens: cannot read from Prometheus (%s); scraping the nodes", error)
        return False
    # The source answers what the monitor's hooks read of a monitor (latest, group_figures,
    # oom_counts, cycle hooks), so the same hooks run on it.
    monitor = cast("host_memory.HostMemoryMonitor", reader)
    reader.declare_consumer()
    groups = _attach_group_memory(monitor)
    growth = _attach_growth(monitor, window, groups)
    _attach_postmortems(monitor, growth, groups)
    reader.start()
    add_shutdown_hook(reader.stop)
    return True


def _alive_node_ids() -> list[str]:
    """The live nodes of the Ray this process is connected to, or none. Never raises.

    Only a connected Ray counts: the samplers are its actors, whatever view is the default.
    """
    try:
        view = default_cluster_view()
        if not RayClusterView().is_initialized() or not view.is_initialized():
            return []
        found = [(node.get("NodeID"), node.get("Alive")) for node in view.nodes()]
        return [node_id for node_id, alive in found if alive and isinstance(node_id, str)]
    except ray_call_errors(None, AttributeError):  # and a node listed as other than a dict
        return []


_T = TypeVar("_T")


def _optional(warning_key: str, warning: str, attach: Callable[[], _T]) -> _T | None:
    """``attach()``, or None once ``warning`` is logged (once, under ``warning_key``).

    Every feature beyond host memory is optional: one that cannot be set up is not
    exported, and the driver's job goes on.
    """
    return _guarded(attach, lambda _error: warn_once(warning_key, warning, logger=logger))


def _guarded(attach: Callable[[], _T], report: Callable[[Exception], object]) -> _T | None:
    """``attach()``, or None once ``report`` has been told why it failed. Never raises."""
    try:
        return attach()
    except Exception as error:  # noqa: BLE001 set-up never stops the job
        report(error)
        return None


def _attach_group_memory(monitor: host_memory.HostMemoryMonitor) -> GroupMemoryCycle | None:
    def attach() -> GroupMemoryCycle:
        from raylens.distributed.group_memory_cycle import attach_group_memory

        return attach_group_memory(monitor)

    return _optional(
        "driver.group_memory",
        "could not attach per-group memory to host-memory monitoring; it will not be exported",
        attach,
    )


def _attach_growth(
    monitor: host_memory.HostMemoryMonitor,
    window: float | None,
    groups: GroupMemoryCycle | None,
) -> GrowthCycle | None:
    """Name the growth the nodes' samplers publish, after giving them the window and line."""
    try:
        window_s = (
            growth_window_for_sampling(sample_interval_s=DEFAULT_SAMPLE_INTERVAL_S)
            if window is None
            else check_growth_window(window, DEFAULT_SAMPLE_INTERVAL_S, name="growth_window")
        )
    except ValueError as error:
        logger.error("raylens growth: %s; using the default window", error)
        window_s = DEFAULT_GROWTH_WINDOW_S
    system_config = connected_system_config()
    try:
        kill_line = resolve_kill_line_config(system_config=system_config)
    except ValueError as error:
        # Reported, then the next source in order decides: the cluster's own line holds.
        kill_line = resolve_kill_line_config(system_config=system_config, strict=False)
        logger.error(
            "raylens growth: %s; the kill line uses the threshold %g from %s instead",
            error,
            kill_line.threshold,
            kill_line.source,
        )

    def attach() -> GrowthCycle:
        node_history = None
        if groups is not None:
            groups.samplers.configure_growth(window_s=window_s, kill_line=kill_line)
            # From now on every scraped node gets a sampler, started with these settings:
            # the samplers are every node's one home for its growth.
            groups.every_node = True
            node_history = groups.samplers.recent_history
        cycle = GrowthCycle(
            settings=GrowthSettings(window_s=window_s),
            kill_line=kill_line,
            node_history=node_history,
        )
        return attach_growth(monitor, cycle)

    attached = _optional(
        "driver.growth",
        "could not attach memory growth to host-memory monitoring; it will not be exported",
        attach,
    )
    if attached is None:
        return None
    if groups is not None:
        _start_samplers_early(groups)
    return attached


def _start_samplers_early(groups: GroupMemoryCycle) -> None:
    """Start each live node's sampler now, before any group's workers: the newest workers are
    the first Ray's memory monitor kills, so it chooses the sampler last (README, "OOM kills")."""
    _optional(
        "driver.samplers_early",
        "could not start the nodes' samplers ahead of the workers; each starts with its "
        "node's first workers instead",
        lambda: groups.samplers.start_early(_alive_node_ids()),
    )


def _attach_phases(kernel_peaks: bool | None, phase_log: str | os.PathLike[str] | None) -> None:
    def attach() -> None:
        from raylens.distributed.phases import configure_phases
        from raylens.telemetry.phases.memory import register_phase_gauges

        try:
            configure_phases(kernel_peaks=kernel_peaks, log_path=phase_log)
        except (TypeError, ValueError) as error:
            logger.error("raylens phases: %s; using the defaults", error)
        register_phase_gauges()

    _optional(
        "driver.phases", "could not attach phase memory; phase peaks will not be exported", attach
    )


def _attach_postmortems(
    monitor: host_memory.HostMemoryMonitor,
    growth: GrowthCycle | None,
    groups: GroupMemoryCycle | None,
) -> OomWatch | None:
    """Notice OOM kills at every cycle and write a post-mortem for each (see ``telemetry.oom``)."""

    def attach() -> OomWatch:
        from raylens.distributed.phases import current_phase

        watch = OomWatch(
            growth=growth,
            writer=PostMortemWriter(),
            phase_of=current_phase,
            largest_processes_of=None if groups is None else groups.samplers.largest_processes,
        )
        watch.ledger.phase_of = current_phase  # a failed call's report names its phase
        return attach_oom_watch(monitor, watch)

    return _optional(
        "driver.oom",
        "could not attach OOM post-mortems to host-memory monitoring; kills will not be recorded",
        attach,
    )


class _CycleRecorder:
    """A monitor cycle hook appending one :class:`Frame` per cycle to a record file."""

    def __init__(
        self,
        recorder: MemoryRecorder,
        growth: GrowthCycle | None,
        kills: OomWatch | None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.recorder = recorder
        self.growth = growth
        self.kills = kills
        self.wall = wall

    def __call__(self, monitor: host_memory.HostMemoryMonitor) -> None:
        from raylens.distributed.phases import DEFAULT_MARKER
        from raylens.telemetry.group_memory import DEFAULT_SNAPSHOT

        groups = {
            node: {g.group: float(g.rss_bytes) for g in reading.groups}
            for node, (reading, _age) in DEFAULT_SNAPSHOT.latest().items()
        }
        outlooks = self.growth.snapshot.latest() if self.growth is not None else {}
        nodes = []
        for sample in monitor.latest():
            if sample.error is not None:
                continue
            outlook = outlooks.get(sample.node_id)
            nodes.append(
                NodeFrame(
                    sample.node_id,
                    sample.host,
                    sample.used,
                    sample.total,
                    outlook.limit if outlook is not None else None,
                    groups.get(sample.node_id, {}),
                )
            )
        current = DEFAULT_MARKER.current_started()
        recent = self.kills.ledger.recent() if self.kills is not None else []
        self.recorder.append(
            Frame(
                self.wall(),
                tuple(nodes),
                () if current is None else (("driver", current[0], current[1]),),
                tuple(kill.as_plain() for kill in recent),
            )
        )


def _attach_record(
    monitor: host_memory.HostMemoryMonitor,
    path: str | os.PathLike[str],
    growth: GrowthCycle | None,
    kills: OomWatch | None,
) -> None:
    try:
        recorder = MemoryRecorder(path)
    except (TypeError, ValueError) as error:
        logger.error("raylens record: %s; nothing is recorded", error)
        return
    monitor.add_cycle_hook(_CycleRecorder(recorder, growth, kills))
