"""The memory profiler: samples the host and managed server trees on a background thread.

What one sample reads comes from :mod:`raylens.telemetry.procfs`; where its
values go, from :mod:`raylens.telemetry.process_memory._profiler_series`. This module decides
when to read (PSS less often than RSS, when asked), tells a live server from one
that exited or whose pid was reused, and keeps per-server state (peaks, the last
PSS) only for the servers it measures now.

PSS is read less often because it is costly: the kernel walks the process's page
tables under its mmap lock, milliseconds per resident gigabyte, holding up the
process's own page faults meanwhile. In between, RSS comes from ``statm`` alone and
the last PSS is reported with its age.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from raylens.lens import reset_warn_once, warn_once
from raylens.telemetry.process_memory import _profiler_series
from raylens.telemetry.process_memory._profiler_series import (
    HOST_USED,
    PSS,
    RSS,
    ProcessMemorySeries,
    ServerMemoryTarget,
    raise_peak,
)
from raylens.telemetry.procfs import (
    HostMemory,
    ProcessTreeMemory,
    ProcFS,
    PssSchedule,
    as_procfs,
    collect_host_memory,
)
from raylens.validation import positive_seconds

logger = logging.getLogger("raylens.telemetry.process_memory")

# The module a profiler publishing to DEFAULT_SERIES looks record_server_memory and
# record_host_memory up on at each sample; the public facade names itself here when it
# is imported (see record_through), so no private module imports the facade.
_recording_module: ModuleType | None = None


def record_through(module: ModuleType) -> None:
    """Have profilers look their two recording functions up on ``module`` at each sample.

    ``raylens.telemetry.process_memory`` calls this with itself, so a test that replaces
    ``record_server_memory`` or ``record_host_memory`` there with ``monkeypatch.setattr``
    reaches every profiler on :data:`DEFAULT_SERIES`, as it does on NeMo-Gym.
    """
    global _recording_module
    _recording_module = module


def _replaced(name: str) -> Callable[..., None] | None:
    """The function now bound to ``name`` on the recording module, if it is not the series' own."""
    original = getattr(_profiler_series, name)
    module = _recording_module
    current = getattr(module, name, original) if module is not None else original
    return None if current is original else current


THREAD_NAME = "raylens-memory-profiler"
STOP_TIMEOUT_SECONDS = 10.0
"""How long :meth:`MemoryProfiler.stop` waits for a sample in progress to finish."""


_T = TypeVar("_T")


def _callers_code(call: Callable[[], _T], warning_key: str, warning: str) -> tuple[bool, _T | None]:
    """``(True, call())``, or ``(False, None)`` once ``warning`` is logged (once per key).

    Guards what the caller chose (the collectors, replaced recording functions) and the
    sampling thread. A failure costs only the values it was to give.
    """
    try:
        return True, call()
    except Exception:  # noqa: BLE001 the caller's collectors; the thread lives
        warn_once(warning_key, warning, logger=logger)
        return False, None


class SampleStatus(str, enum.Enum):
    """What a profiler found when it last sampled a server.

    Members are strings equal to their values (``SampleStatus.LIVE == "live"``),
    and print and serialise as those values, so code written against the plain
    strings keeps working.
    """

    LIVE = "live"
    """The root process is the one the target was built for, and was measured."""
    EXITED = "exited"
    """The root process is gone, or the tree was found empty."""
    REUSED = "reused"
    """The root's pid now belongs to another process that started later."""
    FAILED = "failed"
    """The collector raised; nothing is known about the server at this sample."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, format_spec: str) -> str:
        return format(self.value, format_spec)


LIVE = SampleStatus.LIVE
EXITED = SampleStatus.EXITED
REUSED = SampleStatus.REUSED
FAILED = SampleStatus.FAILED


@dataclass(frozen=True)
class ServerMemorySample:
    """What a profiler last measured for one server.

    ``status`` is a :class:`SampleStatus` (equal to ``"live"``, ``"exited"``,
    ``"reused"`` or ``"failed"``).
    Values not known at that sample are None. ``pss_bytes`` may come from an
    earlier sample when PSS is read less often than RSS; ``pss_age_seconds``
    says how much earlier (0 when read at this sample).
    """

    target: ServerMemoryTarget
    status: SampleStatus
    rss_bytes: int | None
    pss_bytes: int | None
    pss_age_seconds: float | None
    process_count: int | None
    peak_rss_bytes: int | None
    peak_pss_bytes: int | None


@dataclass(frozen=True)
class MemoryProfileReading:
    """One sample of the host and of every server a profiler watches (what
    :meth:`MemoryProfiler.latest` returns)."""

    taken_at: float
    host: HostMemory | None
    host_peak_used_bytes: int | None
    servers: tuple[ServerMemorySample, ...]


def _check_interval(name: str, value: object) -> float:
    # The sampling thread waits on this, so it must fit the platform's timers.
    return positive_seconds(name, value, maximum=threading.TIMEOUT_MAX)


def _check_target(target: object) -> None:
    if not isinstance(target, ServerMemoryTarget):
        raise TypeError(f"targets must be ServerMemoryTarget objects, got {target!r}")


def _collector_warning_key(name: str) -> str:
    return f"process_memory.collector.{name}"


def _without_pss(collector: Callable[..., ProcessTreeMemory]) -> Callable[[int], ProcessTreeMemory]:
    """``collector`` called with ``include_pss=False``: a tree's RSS only, cheaper to read."""
    return functools.partial(collector, include_pss=False)


def _accepts_include_pss(collector: Callable[..., object]) -> bool:
    try:
        parameters = inspect.signature(collector).parameters
    except (TypeError, ValueError):
        return False
    return "include_pss" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


class MemoryProfiler:
    """Sample host memory and the process trees of managed servers, on a background thread.

    ``start()`` takes a first sample at once, then one every ``interval_seconds``
    on a daemon thread named ``raylens-memory-profiler``; ``stop()`` ends the
    thread and takes a last sample, and the profiler can be started again.
    Each sample is exported through lens (see the module docs) and readable with
    :meth:`latest`.

    ``collector(pid)`` measures one tree, ``host_collector()`` the host; they
    default to the reader of ``procfs`` and to psutil. ``pss_interval_seconds`` limits how
    often PSS is read (every sample when None); it needs a collector that
    takes ``include_pss=False`` for the samples in between, as the default does.
    ``clock`` (default :func:`time.monotonic`) times PSS reads. ``procfs`` is
    where process trees are read and pid reuse is checked. ``series`` is the
    :class:`ProcessMemorySeries` the samples are published to (default
    :data:`DEFAULT_SERIES`, the one lens exports); a test may pass its own to keep
    its points apart from every other profiler's.

    Nothing raised while sampling escapes the thread: it is logged once (see
    :func:`raylens.lens.warn_once`) and the next sample runs as usual.
    """

    def __init__(
        self,
        targets: list[ServerMemoryTarget],
        interval_seconds: float,
        collector: Callable[[int], ProcessTreeMemory] | None = None,
        host_collector: Callable[[], HostMemory] = collect_host_memory,
        *,
        pss_interval_seconds: float | None = None,
        clock: Callable[[], float] | None = None,
        procfs: ProcFS | str | os.PathLike[str] | None = None,
        series: ProcessMemorySeries | None = None,
    ) -> None:
        self._interval = _check_interval("interval_seconds", interval_seconds)
        self._pss_interval = (
            None
            if pss_interval_seconds is None
            else _check_interval("pss_interval_seconds", pss_interval_seconds)
        )
        targets = list(targets)
        for target in targets:
            _check_target(target)
        names = [t.name for t in targets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"server names must be unique; repeated: {', '.join(duplicates)}")
        if series is not None and not isinstance(series, ProcessMemorySeries):
            raise TypeError(f"series must be a ProcessMemorySeries or None, got {series!r}")
        self._series = _profiler_series.DEFAULT_SERIES if series is None else series
        self._targets = {target.name: target for target in targets}
        self._procfs = as_procfs(procfs)
        if collector is None:
            collector = self._procfs.tree_memory
        elif self._pss_interval is not None and not _accepts_include_pss(collector):
            raise TypeError(
                "pss_interval_seconds needs a collector that accepts include_pss=False "
                f"for RSS-only samples; {collector!r} does not"
            )
        self._collector = collector
        # What reads a tree without its PSS: only ever called when PSS is read less often,
        # in which case the collector was checked above to take include_pss.
        self._rss_collector = (
            _without_pss(collector) if _accepts_include_pss(collector) else collector
        )
        self._host_collector = host_collector
        self._clock = clock
        self._peaks: dict[tuple[str, str], int] = {}
        self._host_peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Reentrant so that start() and stop() can hold it, with a bounded wait, around
        # the sample_once() they take themselves.
        self._sample_lock = threading.RLock()
        self._pss: dict[str, tuple[int, float]] = {}
        # When each server's PSS was last tried, and so when it is due again.
        self._pss_attempted = PssSchedule(self._pss_interval)
        self._latest: MemoryProfileReading | None = None
        # Guards the targets and everything kept per target (peaks, carried PSS, the
        # exported entry), so a target removed while it is being measured leaves nothing.
        self._state_lock = threading.Lock()
        # Keeps this profiler's exported servers apart from other profilers' of the same
        # name; once it is garbage-collected, a later entry of the same name replaces them.
        self._owner = self._series.new_owner()
        weakref.finalize(self, self._series.release_owner, self._owner).atexit = False

    @property
    def targets(self) -> list[ServerMemoryTarget]:
        """The servers this profiler measures (a copy)."""
        with self._state_lock:
            return list(self._targets.values())

    def add_target(self, target: ServerMemoryTarget) -> None:
        """Measure ``target`` too, from the next sample on; running or not.

        Raises ValueError if a server of that name is already measured (remove it
        first: a restarted server is a new target, with its new pid).
        """
        _check_target(target)
        with self._state_lock:
            if target.name in self._targets:
                raise ValueError(
                    f"a server named {target.name!r} is already measured "
                    f"({self._targets[target.name]!r}); remove it before adding {target!r}"
                )
            self._targets[target.name] = target

    def remove_target(self, target: ServerMemoryTarget | str) -> ServerMemoryTarget:
        """Stop measuring a server (given as a target or by name) and forget it; return it.

        Its peaks, its carried PSS, its exported series and its remembered warning
        go with it, so what a profiler holds follows the servers it measures now,
        however many have come and gone. Raises ValueError for a server it does
        not measure.
        """
        name = target if isinstance(target, str) else getattr(target, "name", None)
        with self._state_lock:
            current = self._targets.get(name) if isinstance(name, str) else None
            if current is None or (not isinstance(target, str) and current != target):
                measured = ", ".join(repr(n) for n in self._targets) or "none"
                raise ValueError(
                    f"{target!r} is not measured by this profiler; measured: {measured}"
                )
            del self._targets[current.name]
            for memory_type in (RSS, PSS):
                self._peaks.pop((current.name, memory_type), None)
            self._pss.pop(current.name, None)
            self._pss_attempted.forget(current.name)
            self._series.forget_server(current, owner=self._owner)
        reset_warn_once(_collector_warning_key(current.name))
        return current

    @property
    def is_running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._thread is not None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.monotonic()

    def start(self) -> None:
        """Reset the peaks, take a first sample now, then sample in the background.

        Does nothing on a profiler that is already running. Raises RuntimeError
        if a sample of the previous run is still stuck in progress after
        :data:`STOP_TIMEOUT_SECONDS`, or if there are servers to measure and this
        host has no usable Linux procfs (see :func:`process_tree_memory_supported`).
        Host memory alone works anywhere.
        """
        if self._thread is not None:
            return
        if self._targets and not self._procfs.supported():
            raise RuntimeError(
                f"cannot measure process trees on platform {sys.platform!r} with procfs at "
                f"{self._procfs.root!r}: Linux with /proc/<pid>/statm and "
                "/proc/<pid>/task/<tid>/children is needed (check "
                "process_tree_memory_supported() first, or profile host memory only "
                "with no targets)"
            )
        if not self._sample_lock.acquire(timeout=STOP_TIMEOUT_SECONDS):
            raise RuntimeError(
                "memory profiler cannot start: a sample of its previous run is still in "
                f"progress after {STOP_TIMEOUT_SECONDS} s (a collector or a procfs read is "
                "stuck); try again once it returns"
            )
        try:
            self._peaks.clear()
            self._host_peaks.clear()
            self._pss.clear()
            self._pss_attempted.clear()
            self._stop = threading.Event()
            self.sample_once()
        finally:
            self._sample_lock.release()
        thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        thread.start()
        self._thread = thread

    def stop(self) -> None:
        """Stop the background thread, then take and export one last sample.

        Waits up to :data:`STOP_TIMEOUT_SECONDS` in all for a sample in progress;
        if that sample is still stuck, the last sample is skipped (warned once)
        rather than waited for. Does nothing if the profiler is not running.
        """
        thread = self._thread
        if thread is None:
            return
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        self._stop.set()
        thread.join(STOP_TIMEOUT_SECONDS)
        self._thread = None
        if thread.is_alive():
            warn_once(
                "process_memory.stop",
                f"memory profiler thread did not stop within {STOP_TIMEOUT_SECONDS} s",
                logger=logger,
            )
        if not self._sample_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            warn_once(
                "process_memory.stop.final_sample",
                "memory profiler skipped its last sample: the sample in progress is stuck",
                logger=logger,
            )
            return
        try:
            self.sample_once()
        finally:
            self._sample_lock.release()

    def _run(self) -> None:
        stop = self._stop  # this run's event; a later start() makes a new one
        while not stop.wait(self._interval):
            # The sampling thread's last guard: it samples on whatever failed.
            _callers_code(
                self.sample_once, "process_memory.sample", "memory profiler sample failed"
            )

    def sample_once(self) -> None:
        """Measure the host and every server once, export the results, keep them for :meth:`latest`.

        A failing collector costs only its own values for this sample (logged
        once); the other servers and the host are still measured. Exporting never
        raises: a broken meter costs the sample its points, not its values.
        """
        with self._sample_lock:
            now = self._now()
            _, host = _callers_code(
                self._host_collector,
                "process_memory.host_collector",
                "collecting host memory failed; no host values this sample",
            )
            peak = raise_peak(
                self._host_peaks, HOST_USED, None if host is None else host.used_bytes
            )
            replacement = self._replacement("record_host_memory")
            if replacement is None:
                self._series.publish_host(host, peak)
            elif host is not None:
                self._call_replacement(replacement, "record_host_memory", host, self._host_peaks)
            with self._state_lock:
                targets = list(self._targets.values())
            sampled = (self._sample_target(target, now) for target in targets)
            servers = tuple(sample for sample in sampled if sample is not None)
            self._latest = MemoryProfileReading(
                taken_at=now,
                host=host,
                host_peak_used_bytes=self._host_peaks.get(HOST_USED),
                servers=servers,
            )

    def _sample_target(self, target: ServerMemoryTarget, now: float) -> ServerMemorySample | None:
        """Measure one server and keep the result; None if it was removed meanwhile."""
        name = target.name
        gone = ProcessTreeMemory(0, 0, 0)
        status = LIVE
        read_pss = False
        memory: ProcessTreeMemory | None
        current_ticks = None if target.start_ticks is None else self._procfs.start_ticks(target.pid)
        if current_ticks != target.start_ticks:
            # The root exited, or its pid now belongs to a process that started later.
            status = EXITED if current_ticks is None else REUSED
            memory = gone
        else:
            read_pss = self._pss_attempted.due(name, now)
            collector = self._collector if read_pss else self._rss_collector
            measured, memory = _callers_code(
                lambda: collector(target.pid),
                _collector_warning_key(name),
                f"measuring server {name!r} (pid {target.pid}) failed; no values this sample",
            )
            if not measured:
                status = FAILED
            if memory is not None and memory.process_count <= 0:
                status, memory = EXITED, gone
        with self._state_lock:
            if self._targets.get(name) is not target:
                return None
            pss_age: float | None = None
            if status != LIVE:
                self._pss.pop(name, None)
                self._pss_attempted.forget(name)
            elif read_pss and memory is not None:
                self._pss_attempted.attempted(name, now)
                if memory.pss_bytes is None:
                    self._pss.pop(name, None)
                else:
                    self._pss[name] = (memory.pss_bytes, now)
                    pss_age = 0.0
            elif memory is not None:
                carried = self._pss.get(name)
                pss = None
                if carried is not None:
                    pss, read_at = carried
                    pss_age = max(0.0, now - read_at)
                memory = ProcessTreeMemory(memory.rss_bytes, pss, memory.process_count)
            peak_rss = raise_peak(
                self._peaks, (name, RSS), None if memory is None else memory.rss_bytes
            )
            peak_pss = raise_peak(
                self._peaks, (name, PSS), None if memory is None else memory.pss_bytes
            )
            replacement = self._replacement("record_server_memory")
            if replacement is None:
                self._series.publish_server(target, memory, peak_rss, peak_pss, owner=self._owner)
        # Outside the state lock: a replacement is the caller's code and may call back in.
        if replacement is not None and memory is not None:
            self._call_replacement(replacement, "record_server_memory", target, memory, self._peaks)
        live = memory if status == LIVE else None
        return ServerMemorySample(
            target=target,
            status=status,
            rss_bytes=None if live is None else live.rss_bytes,
            pss_bytes=None if live is None else live.pss_bytes,
            pss_age_seconds=None if live is None or live.pss_bytes is None else pss_age,
            process_count=None if live is None else live.process_count,
            peak_rss_bytes=peak_rss,
            peak_pss_bytes=peak_pss,
        )

    def _replacement(self, name: str) -> Callable[..., None] | None:
        """A replaced recording function to call instead of publishing, or None.

        Only a profiler on :data:`DEFAULT_SERIES`, the series the module-level
        functions write, hands its samples to them; the original functions are not
        called but stood in for by publishing straight into the series, so that each
        profiler's servers stay apart from another's of the same name.
        """
        return _replaced(name) if self._series is _profiler_series.DEFAULT_SERIES else None

    def _call_replacement(self, function: Callable[..., None], name: str, *args: Any) -> None:
        """Call a replaced recording function the way NeMo-Gym's profiler does; never raises.

        The peaks passed are the profiler's own, already raised to this sample, so a
        replacement that raises them again changes nothing.
        """
        _callers_code(
            lambda: function(*args),
            f"process_memory.replaced.{name}",
            f"the replaced {name} failed; this sample's values are kept but not recorded",
        )

    def latest(self) -> MemoryProfileReading | None:
        """The most recent sample (None before the first), e.g. for a live table."""
        return self._latest
