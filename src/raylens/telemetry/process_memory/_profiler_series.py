"""The series a memory profiler exports, and the servers they describe.

A sample is published into a snapshot here (one entry per profiler and server
name, plus the host), and lens observable gauges read that snapshot at each
collection; the callbacks never touch procfs. Two profilers measuring servers of
the same name each keep their points; a server that two profilers measure (same
name, type and pid) is one point, from whichever sampled it last. The points of a
profiler that was garbage-collected stay, as its last word, until a server of the
same name is published again; so what is held stays bounded by the names in use
however many profilers come and go. The gauges are declared with lens the first time a
sample is published with telemetry on, never at import; when the installed telemetry handle
is not lens' own but any object with a ``meter`` (as NeMo-Gym's tests install), they are
created on that meter instead, once per meter. Publishing never raises:
a meter or exporter that fails costs that sample its points and one warning.

State: each :class:`ProcessMemorySeries` holds its own snapshot and the meters
it set its gauges up on. :data:`DEFAULT_SERIES` is the one the module-level
functions and profilers built without ``series=`` use, and the one that
exports; :func:`reset_process_memory_state` resets it.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import TypeVar

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.util.types import AttributeValue

from raylens.lens import (
    OBSERVABLE_GAUGE,
    RecordedMetric,
    TelemetryHandle,
    get_telemetry_handle,
    register_observable_gauge,
    unregister_observable_gauge,
    warn_once,
)
from raylens.safe_text import encodable
from raylens.telemetry.procfs import HostMemory, ProcessTreeMemory, ProcFS, as_procfs, check_pid

logger = logging.getLogger("raylens.telemetry.process_memory")

# Memory types, the values of the ``memory.type`` attribute.
RSS = "rss"
PSS = "pss"
# Key of the host peak in a profiler's host peaks.
HOST_USED = "used"


@dataclass(frozen=True)
class ServerMemoryTarget:
    """A managed server to measure: its name, its kind, and the pid of its root process.

    Build it right after spawning the server. Construction records when that
    process started (``start_ticks``, read from ``procfs``); a later sample whose
    pid shows a different start time is measuring a stranger that inherited the
    pid, so the profiler reports the server as gone instead. ``start_ticks`` is
    None when the process could not be read at construction; its identity is
    then not checked.

    A target is immutable and hashes by ``(name, server_type, pid)``, so it can key
    a dict or sit in a set. Names often come from a command line (``argv[0]``),
    where bytes that are not UTF-8 decode to lone surrogates; those are replaced
    by U+FFFD here, so every exporter can encode the name.
    """

    name: str
    server_type: str
    pid: int
    _: KW_ONLY
    procfs: InitVar[ProcFS | str | os.PathLike[str] | None] = None
    start_ticks: int | None = field(init=False, default=None, compare=False)

    def __post_init__(self, procfs: ProcFS | str | os.PathLike[str] | None) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"server name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.server_type, str) or not self.server_type:
            raise ValueError(
                f"server_type of {self.name!r} must be a non-empty string, got {self.server_type!r}"
            )
        check_pid(f"pid of server {self.name!r}", self.pid)
        # Frozen: the constructor alone may set fields, through object.__setattr__.
        object.__setattr__(self, "name", encodable(self.name))
        object.__setattr__(self, "server_type", encodable(self.server_type))
        object.__setattr__(self, "start_ticks", as_procfs(procfs).start_ticks(self.pid))


_SERVER_MEMORY = RecordedMetric(
    "gym.server.memory.usage",
    OBSERVABLE_GAUGE,
    "By",
    "Memory held by a managed server's process tree at the latest sample, by memory.type.",
)
_SERVER_PEAK = RecordedMetric(
    "gym.server.memory.sampled_peak",
    OBSERVABLE_GAUGE,
    "By",
    "Largest sampled memory of a managed server's process tree since profiling started.",
)
_SERVER_PROCESSES = RecordedMetric(
    "gym.server.processes",
    OBSERVABLE_GAUGE,
    "{process}",
    "Processes in a managed server's tree at the latest sample.",
)
_HOST_USAGE = RecordedMetric(
    "gym.host.memory.usage",
    OBSERVABLE_GAUGE,
    "By",
    "Host memory in use: total minus available.",
)
_HOST_AVAILABLE = RecordedMetric(
    "gym.host.memory.available",
    OBSERVABLE_GAUGE,
    "By",
    "Host memory that can be given to processes without swapping.",
)
_HOST_TOTAL = RecordedMetric(
    "gym.host.memory.total", OBSERVABLE_GAUGE, "By", "Physical memory of the host."
)
_HOST_PEAK = RecordedMetric(
    "gym.host.memory.sampled_peak",
    OBSERVABLE_GAUGE,
    "By",
    "Largest sampled host memory in use since profiling started.",
)


@dataclass
class _ServerPoints:
    target: ServerMemoryTarget
    attributes: dict[str, AttributeValue]
    rss: int | None = None
    pss: int | None = None
    processes: int | None = None
    peak_rss: int | None = None
    peak_pss: int | None = None


@dataclass
class _HostPoints:
    memory: HostMemory | None = None
    peak_used: int | None = None


_Key = TypeVar("_Key")


def raise_peak(peaks: dict[_Key, int], key: _Key, value: int | None) -> int | None:
    """Raise ``peaks[key]`` to ``value`` (None: unknown, left alone); return the peak."""
    if value is not None and value > peaks.get(key, -1):
        peaks[key] = value
    return peaks.get(key)


def _server_attributes(target: ServerMemoryTarget) -> dict[str, AttributeValue]:
    return {
        "nemo.gym.server.name": target.name,
        "nemo.gym.server.type": target.server_type,
        "process.pid": target.pid,
    }


def _by_memory_type(
    entries: list[tuple[dict[str, AttributeValue], int | None, int | None]],
) -> list[Observation]:
    """One point per known value of ``(attributes, rss, pss)``, tagged with its memory.type."""
    points = []
    for attributes, rss, pss in entries:
        if rss is not None:
            points.append(Observation(rss, {**attributes, "memory.type": RSS}))
        if pss is not None:
            points.append(Observation(pss, {**attributes, "memory.type": PSS}))
    return points


_T = TypeVar("_T")


def _foreign_meter(
    call: Callable[[], _T], warning_key: str, warning: str
) -> tuple[bool, _T | None]:
    """``(True, call())``, or ``(False, None)`` once ``warning`` is logged. Never raises.

    The one guard around meters lens did not make: a handle installed from outside brings
    a meter, and instruments, of any make.
    """
    try:
        return True, call()
    except Exception:  # noqa: BLE001 a meter of any make: nothing may escape
        warn_once(warning_key, warning, logger=logger)
        return False, None


def _never_raising(
    name: str, callback: Callable[..., Iterable[Observation]]
) -> Callable[[CallbackOptions], list[Observation]]:
    """``callback`` for a meter outside lens: a failure costs that collection its points."""

    def observe(options: CallbackOptions) -> list[Observation]:
        # Runs inside a meter that is not lens': nothing may escape to it.
        _, points = _foreign_meter(
            lambda: list(callback(options)),
            f"process_memory.callback.{name}",
            f"reading the points of {name!r} failed; no points this collection",
        )
        return points or []

    return observe


_HOST_PICKS: tuple[tuple[RecordedMetric, Callable[[_HostPoints], int | None]], ...] = (
    (_HOST_USAGE, lambda h: h.memory.used_bytes if h.memory else None),
    (_HOST_AVAILABLE, lambda h: h.memory.available_bytes if h.memory else None),
    (_HOST_TOTAL, lambda h: h.memory.total_bytes if h.memory else None),
    (_HOST_PEAK, lambda h: h.peak_used),
)


class ProcessMemorySeries:
    """The points of the ``gym.*`` series for one set of profilers, read by gauge callbacks.

    Profilers publish each sample here and the callbacks only read what was
    published. The module keeps one default instance, :data:`DEFAULT_SERIES`,
    which every :class:`MemoryProfiler` built without ``series=`` and the
    module-level ``record_*`` functions write to, and which alone declares the
    gauges with lens (``export=True``). An instance built by hand keeps its
    points to itself: :meth:`points` reads them, and nothing reaches lens. lens
    holds one callback per series name, so at most one instance in a process
    should export.

    Server points are kept per profiler (an owner from :meth:`new_owner`) and
    server name. The host has one set of points per instance: every profiler on
    an instance overwrites it, so the host values and the host peak exported are
    those of whichever profiler sampled last. That suits the default instance, as
    a process runs on one host.
    """

    def __init__(self, *, export: bool = False) -> None:
        self._export = export
        self._lock = threading.Lock()
        # {(owner, server name): points}; owner None for values recorded outside a profiler.
        self._servers: dict[tuple[int | None, str], _ServerPoints] = {}
        self._host = _HostPoints()
        self._owners = itertools.count(1)
        # Owners whose profiler was garbage-collected, handled at the next use of the lock.
        self._gone_owners: deque[int] = deque()
        # Keys of entries whose profiler is gone; the next entry of that name replaces them.
        self._orphans: set[tuple[int | None, str]] = set()
        # Meters this instance has set its gauges up on, with the gauges by registry key.
        self._instruments: weakref.WeakKeyDictionary[Meter, dict[str, RecordedMetric]] = (
            weakref.WeakKeyDictionary()
        )
        # The same, for meters outside lens that cannot be weakly referenced.
        self._unreferenceable: list[tuple[Meter, dict[str, RecordedMetric]]] = []
        self._gauges: tuple[tuple[RecordedMetric, Callable[..., Iterable[Observation]]], ...] = (
            (_SERVER_MEMORY, self._observe_server_usage),
            (_SERVER_PEAK, self._observe_server_peak),
            (_SERVER_PROCESSES, self._observe_server_processes),
            *((metric, self._host_callback(pick)) for metric, pick in _HOST_PICKS),
        )

    # ------------------------------------------------------------ owners

    def new_owner(self) -> int:
        """A fresh owner id for one profiler's entries."""
        return next(self._owners)

    def release_owner(self, owner: int) -> None:
        """Mark every entry of ``owner`` as replaceable by the next entry of the same name.

        Meant for a finalizer, which may run in any thread at any allocation, even
        one made while this instance's lock is held: so it takes no lock and only
        queues the owner.
        """
        self._gone_owners.append(owner)

    def _drop_gone_owners(self) -> None:
        """Turn the entries of released owners into orphans. The caller holds the lock."""
        while self._gone_owners:
            owner = self._gone_owners.popleft()
            self._orphans.update(key for key in self._servers if key[0] == owner)

    def _current_servers(self) -> list[_ServerPoints]:
        """One entry per measured server, the latest published. The caller holds the lock."""
        self._drop_gone_owners()
        latest: dict[ServerMemoryTarget, _ServerPoints] = {}
        for entry in self._servers.values():  # in publishing order: a later entry wins
            latest[entry.target] = entry
        return list(latest.values())

    def entry_count(self) -> int:
        """How many server entries are held, those of collected profilers included."""
        with self._lock:
            return len(self._servers)

    # ------------------------------------------------------------ gauge callbacks

    def _observe_server_usage(self, _options: CallbackOptions | None = None) -> list[Observation]:
        with self._lock:
            entries = [(e.attributes, e.rss, e.pss) for e in self._current_servers()]
        return _by_memory_type(entries)

    def _observe_server_peak(self, _options: CallbackOptions | None = None) -> list[Observation]:
        with self._lock:
            entries = [(e.attributes, e.peak_rss, e.peak_pss) for e in self._current_servers()]
        return _by_memory_type(entries)

    def _observe_server_processes(
        self, _options: CallbackOptions | None = None
    ) -> list[Observation]:
        with self._lock:
            return [
                Observation(e.processes, dict(e.attributes))
                for e in self._current_servers()
                if e.processes is not None
            ]

    def _host_callback(
        self, pick: Callable[[_HostPoints], int | None]
    ) -> Callable[..., list[Observation]]:
        def callback(_options: CallbackOptions | None = None) -> list[Observation]:
            with self._lock:
                value = pick(self._host)
            return [] if value is None else [Observation(value)]

        return callback

    def points(self, name: str) -> dict[frozenset[tuple[str, AttributeValue]], int | float]:
        """``{frozenset(attribute items): value}`` that series ``name`` would export now.

        Raises ValueError for a name that is not one of this module's series.
        """
        for metric, callback in self._gauges:
            if metric.name == name:
                return {
                    frozenset((point.attributes or {}).items()): point.value
                    for point in callback(None)
                }
        known = ", ".join(metric.name for metric, _ in self._gauges)
        raise ValueError(f"no process-memory series named {name!r}; the series are {known}")

    # ------------------------------------------------------------ lens

    def _register_gauges(self) -> dict[str, RecordedMetric]:
        for metric, callback in self._gauges:
            register_observable_gauge(metric, callback)
        return {metric.key: metric for metric, _ in self._gauges}

    def _create_on(self, meter: Meter) -> dict[str, RecordedMetric]:
        """Create this instance's gauges on ``meter`` itself, outside lens' declarations.

        For a telemetry handle that is not lens' own: an object with just a ``meter``
        (as NeMo-Gym's tests install) has none of the pipeline state lens registers
        gauges through. The callbacks never raise into the SDK's collection.
        """
        for metric, callback in self._gauges:
            meter.create_observable_gauge(
                metric.name,
                callbacks=[_never_raising(metric.name, callback)],
                unit=metric.unit,
                description=metric.description,
            )
        return {metric.key: metric for metric, _ in self._gauges}

    def _get_instruments(
        self, meter: Meter, *, lens_pipeline: bool = True
    ) -> dict[str, RecordedMetric]:
        """Make sure ``meter``'s pipeline exports this instance's gauges; return them by key.

        On lens' own pipeline (``lens_pipeline``) the gauges are registered with lens:
        that is idempotent and survives pipeline restarts, and doing it again the first
        time each meter is seen also restores the gauges if the lens declarations were
        cleared in between. Otherwise they are created on ``meter`` directly, once per
        meter. A meter is remembered only once its gauges were set up, so a failed
        attempt is tried again at the next sample.
        """
        set_up = self._register_gauges if lens_pipeline else lambda: self._create_on(meter)
        try:
            cached = self._instruments.get(meter)
        except TypeError:  # a meter that cannot be weakly referenced is remembered by identity
            for known, gauges in self._unreferenceable:
                if known is meter:
                    return gauges
            gauges = set_up()
            if not lens_pipeline:  # lens' registration is idempotent; direct creation is not
                self._unreferenceable.append((meter, gauges))
            return gauges
        if cached is None:
            cached = set_up()
            self._instruments[meter] = cached
        return cached

    def exported_meters(self) -> int:
        """How many meters this instance has set its gauges up on."""
        return len(self._instruments) + len(self._unreferenceable)

    def _ensure_exported(self) -> None:
        """Set up the gauges on the running pipeline, if this instance exports. Never raises.

        A meter or exporter that fails here must not reach the profiled server or
        the caller: the failure costs this sample its points and is logged once.
        """
        if not self._export:
            return
        handle = get_telemetry_handle()
        if handle is not None:
            lens_pipeline = isinstance(handle, TelemetryHandle)
            # A handle installed from outside brings a meter of any make.
            _foreign_meter(
                lambda: self._get_instruments(handle.meter, lens_pipeline=lens_pipeline),
                "process_memory.export",
                "setting up the process-memory gauges failed; this sample exports no points",
            )

    # ------------------------------------------------------------ publishing

    def publish_host(self, memory: HostMemory | None, peak_used: int | None) -> None:
        """Make ``memory`` (None: not known this sample) and ``peak_used`` the host values."""
        with self._lock:
            self._host = _HostPoints(memory=memory, peak_used=peak_used)
        self._ensure_exported()

    def publish_server(
        self,
        target: ServerMemoryTarget,
        memory: ProcessTreeMemory | None,
        peak_rss: int | None,
        peak_pss: int | None,
        *,
        owner: int | None = None,
    ) -> None:
        """Make ``memory`` (None: not known this sample) the exported values of ``target``.

        ``owner`` (from :meth:`new_owner`) keeps one profiler's entry apart from
        another's for a server of the same name; None is the owner of values
        recorded outside a profiler.
        """
        entry = _ServerPoints(
            target=target,
            attributes=_server_attributes(target),
            rss=None if memory is None else memory.rss_bytes,
            pss=None if memory is None else memory.pss_bytes,
            processes=None if memory is None else memory.process_count,
            peak_rss=peak_rss,
            peak_pss=peak_pss,
        )
        key = (owner, target.name)
        with self._lock:
            self._drop_gone_owners()
            for orphan in [orphan for orphan in self._orphans if orphan[1] == target.name]:
                self._orphans.discard(orphan)
                self._servers.pop(orphan, None)
            self._servers.pop(key, None)  # re-inserted last: the latest published wins a tie
            self._servers[key] = entry
        self._ensure_exported()

    def forget_server(self, target: ServerMemoryTarget, *, owner: int | None = None) -> None:
        """Drop ``owner``'s values of ``target``, unless its name now belongs to another."""
        key = (owner, target.name)
        with self._lock:
            self._drop_gone_owners()
            entry = self._servers.get(key)
            if entry is not None and entry.target == target:
                del self._servers[key]

    def record_host_memory(self, memory: HostMemory, peaks: dict[str, int]) -> None:
        """Publish ``memory`` as the host memory and raise ``peaks["used"]`` to it.

        See :func:`record_host_memory`; this is the same on this instance.
        """
        if get_telemetry_handle() is None:
            return
        self.publish_host(memory, raise_peak(peaks, HOST_USED, memory.used_bytes))

    def record_server_memory(
        self,
        target: ServerMemoryTarget,
        memory: ProcessTreeMemory,
        peaks: dict[tuple[str, str], int],
    ) -> None:
        """Publish ``memory`` as the memory of ``target`` and raise its peaks.

        See :func:`record_server_memory`; this is the same on this instance.
        """
        if get_telemetry_handle() is None:
            return
        peak_rss = raise_peak(peaks, (target.name, RSS), memory.rss_bytes)
        peak_pss = raise_peak(peaks, (target.name, PSS), memory.pss_bytes)
        self.publish_server(target, memory, peak_rss, peak_pss)

    def reset(self) -> None:
        """Forget every point; an exporting instance also withdraws its gauge declarations."""
        with self._lock:
            self._servers.clear()
            self._gone_owners.clear()
            self._orphans.clear()
            self._host = _HostPoints()
        if self._export:
            self._instruments.clear()
            self._unreferenceable.clear()
            for metric, _callback in self._gauges:
                unregister_observable_gauge(metric.name)


DEFAULT_SERIES = ProcessMemorySeries(export=True)
"""The series every profiler built without ``series=`` and the module-level functions use."""


def record_host_memory(memory: HostMemory, peaks: dict[str, int]) -> None:
    """Publish ``memory`` as the current host memory and raise ``peaks["used"]`` to it.

    ``peaks`` belongs to the caller (a profiler keeps one per run) and is
    updated in place; the exported peak is whatever it holds afterwards. With
    telemetry off (no lens handle) nothing is published and ``peaks`` is left
    alone. Never raises for a failing meter or exporter. Writes to
    :data:`DEFAULT_SERIES`.
    """
    DEFAULT_SERIES.record_host_memory(memory, peaks)


def record_server_memory(
    target: ServerMemoryTarget,
    memory: ProcessTreeMemory,
    peaks: dict[tuple[str, str], int],
) -> None:
    """Publish ``memory`` as the current memory of ``target`` and raise its peaks.

    ``peaks`` is keyed ``(server name, "rss" | "pss")`` and updated in place. A
    tree that is gone (``ProcessTreeMemory(0, 0, 0)``) publishes zeros, so an alert
    on ``gym.server.processes == 0`` fires; a None PSS publishes no PSS value.
    Peaks already reached stay. With telemetry off (no lens handle) nothing is
    published and ``peaks`` is left alone. Never raises for a failing meter or
    exporter. Writes to :data:`DEFAULT_SERIES`.
    """
    DEFAULT_SERIES.record_server_memory(target, memory, peaks)


def reset_process_memory_state() -> None:
    """Reset :data:`DEFAULT_SERIES`: its points, its gauge declarations and its meters."""
    DEFAULT_SERIES.reset()
