"""Noticing workers lost to memory, once each, and leaving a post-mortem for every one.

:class:`OomWatch` is the monitor cycle hook that joins the three sources of a kill (Ray's
eviction counter, a group call's ``OutOfMemoryError``, the kernel's count);
:class:`OomLedger` holds the reports not yet handled, the counts and the recent kills
(:data:`DEFAULT_LEDGER`, emptied by :func:`reset_oom_state`). Invariants a maintainer must keep:

- one kill is recorded once, whichever sources saw it and in whatever order
  (:data:`DEDUP_WINDOW_S`);
- the only Ray call is the ask for a node's largest processes, made only for a kill;
- everything the ledger keeps is bounded, and nothing here raises into the monitor.

The sources, what each kill gets and why: ``docs/architecture.md``, *OOM post-mortems*,
and the README's *OOM kills*.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from raylens import forking
from raylens.lens import (
    OBSERVABLE_COUNTER,
    RecordedMetric,
    register_observable_counter,
    warn_once,
)
from raylens.safe_text import printable
from raylens.telemetry.history import KillLineConfig, RecentHistory
from raylens.telemetry.host_memory import NodeSample
from raylens.telemetry.names import RAY_NODE_ID_ATTR
from raylens.telemetry.oom._kills import CounterWatch, Killer, Victim
from raylens.telemetry.oom._postmortem import LargestProcess, PostMortemWriter, build_postmortem
from raylens.telemetry.raylet_payload import NodeOomCounts

__all__ = [
    "DEDUP_WINDOW_S",
    "DEFAULT_LEDGER",
    "KILLER_ATTR",
    "MAX_PENDING_REPORTS",
    "RECENT_KILLS",
    "RL_HOST_OOM_KILLS_METRIC",
    "KillRecord",
    "LargestProcesses",
    "OomLedger",
    "OomSource",
    "OomWatch",
    "register_oom_counter",
    "report_worker_oom",
    "reset_oom_state",
]

RL_HOST_OOM_KILLS_METRIC = "rl.host.oom_kills"
KILLER_ATTR = "killer"
#: A counted Ray kill and a reported OutOfMemoryError on one node this close are one kill.
DEDUP_WINDOW_S = 60.0
#: Recent kills kept for ``watch``.
RECENT_KILLS = 20
#: Most OutOfMemoryError reports held between two cycles; more are dropped (logged once).
MAX_PENDING_REPORTS = 256
#: Most kills per cycle whose node's sampler is asked for its largest processes (each ask
#: may wait up to its timeout on the monitor's thread); later ones go without the list.
MAX_ASKS_PER_CYCLE = 4
#: Most ``(node, killer)`` counts kept for the counter; kills past it are counted under node "other".
MAX_COUNTED_NODES = 4096
_OTHER_NODE = "other"
_LOGGER = logging.getLogger("raylens.oom")

_METRIC = RecordedMetric(
    RL_HOST_OOM_KILLS_METRIC,
    OBSERVABLE_COUNTER,
    "{kill}",
    "Workers lost to memory on the node, by killer (ray: Ray's memory monitor; kernel: the OOM killer)",
)

#: ``node id -> (largest processes, Unix time of the reading)`` or None when unknown.
LargestProcesses = Callable[[str], "tuple[Sequence[LargestProcess], float | None] | None"]


@dataclass(frozen=True)
class KillRecord:
    """One kill as ``watch`` shows it, and the file its post-mortem went to."""

    node_id: str
    host: str
    killer: Killer
    wall_time: float
    victim: Victim
    path: Path | None
    seen_by: tuple[str, ...] = ()
    #: On the monitor's clock; for matching a late report.
    monotonic_at: float = 0.0
    document: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def as_plain(self) -> dict[str, Any]:
        """JSON-ready: what ``watch --json`` prints per kill."""
        return {
            "node_id": self.node_id,
            "host": self.host,
            "killer": self.killer.value,
            "unix_time": round(self.wall_time, 3),
            "worker_group": self.victim.group,
            "worker_rank": self.victim.worker_rank,
            "pid": self.victim.pid,
            "postmortem": None if self.path is None else str(self.path),
        }


@dataclass(frozen=True)
class _Report:
    node_id: str | None
    victim: Victim
    wall_time: float


class OomLedger:
    """Reports waiting for a cycle, kill counts per node and killer, and the recent kills."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports: list[_Report] = []
        self._counts: dict[tuple[str, str], int] = {}
        self._recent: collections.deque[KillRecord] = collections.deque(maxlen=RECENT_KILLS)
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock (a cycle may have held it at the fork)."""
        self._lock = threading.Lock()

    def report(
        self,
        *,
        node_id: str | None,
        group: str | None,
        worker_rank: int | None = None,
        pid: int | None = None,
        wall_time: float | None = None,
    ) -> None:
        """A worker was lost to Ray's out-of-memory error. Never raises; bounded."""
        entry = _Report(
            node_id if isinstance(node_id, str) and node_id else None,
            Victim(
                group if isinstance(group, str) else None,
                worker_rank if isinstance(worker_rank, int) else None,
                pid if isinstance(pid, int) else None,
            ),
            time.time() if wall_time is None else float(wall_time),
        )
        with self._lock:
            if len(self._reports) < MAX_PENDING_REPORTS:
                self._reports.append(entry)
                return
        warn_once(
            "oom.reports.full",
            f"more than {MAX_PENDING_REPORTS} out-of-memory reports between two monitor cycles; "
            "later ones are dropped (is the host-memory monitor running?)",
            logger=_LOGGER,
        )

    def take_reports(self) -> list[_Report]:
        with self._lock:
            taken, self._reports = self._reports, []
            return taken

    def count(self, node_id: str, killer: Killer) -> None:
        with self._lock:
            key = (node_id, killer.value)
            if key not in self._counts and len(self._counts) >= MAX_COUNTED_NODES:
                key = (_OTHER_NODE, killer.value)
            self._counts[key] = self._counts.get(key, 0) + 1

    def counts(self) -> dict[tuple[str, str], int]:
        """``{(node id, killer): kills}`` since the process started (or the last reset)."""
        with self._lock:
            return dict(self._counts)

    def remember(self, record: KillRecord) -> None:
        with self._lock:
            self._recent.append(record)

    def replace(self, old: KillRecord, new: KillRecord) -> None:
        with self._lock:
            self._recent = collections.deque(
                (new if kept is old else kept for kept in self._recent), maxlen=RECENT_KILLS
            )

    def recent(self) -> list[KillRecord]:
        """The latest :data:`RECENT_KILLS` kills, oldest first."""
        with self._lock:
            return list(self._recent)

    def observe(self, _options: CallbackOptions | None = None) -> list[Observation]:
        return [
            Observation(kills, {RAY_NODE_ID_ATTR: node, KILLER_ATTR: killer})
            for (node, killer), kills in sorted(self.counts().items())
        ]

    def clear(self) -> None:
        with self._lock:
            self._reports.clear()
            self._counts.clear()
            self._recent.clear()


DEFAULT_LEDGER = OomLedger()


#: Tell raylens a worker was lost to Ray's out-of-memory error: :meth:`OomLedger.report`
#: of the default ledger.
report_worker_oom = DEFAULT_LEDGER.report


def reset_oom_state() -> None:
    """Forget every report, count and recent kill of the default ledger (tests)."""
    DEFAULT_LEDGER.clear()


def register_oom_counter(ledger: OomLedger | None = None) -> None:
    """Declare ``rl.host.oom_kills``, read from ``ledger`` (default :data:`DEFAULT_LEDGER`)."""
    register_observable_counter(_METRIC, (ledger or DEFAULT_LEDGER).observe)


class OomSource(Protocol):
    """What an :class:`OomWatch` reads of a monitor: its samples and the kill counters."""

    def latest(self) -> list[NodeSample]: ...

    def oom_counts(self) -> dict[str, tuple[str, NodeOomCounts, float]]: ...


class GrowthHistory(Protocol):
    """Where a node's recent memory and the kill line come from (a growth cycle)."""

    @property
    def kill_line(self) -> KillLineConfig: ...

    def recent_history(self, node_id: str, at: float) -> RecentHistory | None:
        """The node's memory up to ``at`` (the monitor's clock), None when none is kept."""
        ...


@dataclass
class _Kill:
    node_id: str
    host: str
    killer: Killer
    monotonic_at: float
    victim: Victim | None = None
    sources: list[str] = field(default_factory=list)
    kernel_source: str | None = None


def _no_phase() -> str | None:
    return None


class OomWatch:
    """A monitor cycle hook: find the cycle's kills, join their sources, record each once.

    ``growth`` supplies the history and kill line (a
    :class:`~raylens.telemetry.growth.GrowthCycle` attached to the same monitor, before
    this hook); without it a post-mortem has no history. ``writer`` None writes no
    files (a ``watch`` that only shows kills). ``phase_of`` names the job's current
    phase (default: none). ``largest_processes_of`` asks a node's sampler for its
    largest processes (the driver wires it; default: none). ``wall_clock`` stamps
    kills (default :func:`time.time`). Never raises into the monitor: a failure is
    logged once per kind by the monitor and the next cycle carries on.
    """

    def __init__(
        self,
        *,
        growth: GrowthHistory | None = None,
        writer: PostMortemWriter | None = None,
        phase_of: Callable[[], str | None] = _no_phase,
        largest_processes_of: LargestProcesses | None = None,
        ledger: OomLedger | None = None,
        wall_clock: Callable[[], float] = time.time,
        dedup_window_s: float = DEDUP_WINDOW_S,
    ) -> None:
        self.growth = growth
        self.writer = writer
        self.phase_of = phase_of
        self.largest_processes_of = largest_processes_of
        self.ledger = ledger if ledger is not None else DEFAULT_LEDGER
        self.wall_clock = wall_clock
        self.dedup_window_s = float(dedup_window_s)
        self._ray = CounterWatch()
        self._kernel = CounterWatch()
        #: Per host: the highest kernel count already turned into kills.
        self._host_kernel: dict[str, float] = {}
        #: Kills written from a report, waiting for the counter to show them.
        self._awaiting_counter: list[KillRecord] = []
        #: Ray kills written from the counter alone, waiting for a report naming the victim.
        self._awaiting_victim: list[KillRecord] = []
        self._asks_left = MAX_ASKS_PER_CYCLE
        self._lock = threading.Lock()
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock."""
        self._lock = threading.Lock()

    def __call__(self, monitor: OomSource) -> None:
        with self._lock:
            self._asks_left = MAX_ASKS_PER_CYCLE
            samples = {sample.node_id: sample for sample in monitor.latest()}
            now = self.wall_clock()
            self._expire(now)
            kills = self._counted(monitor.oom_counts(), samples)
            reports = self.ledger.take_reports()
            for kill in kills:
                if kill.killer is Killer.RAY and self._matched(kill, reports):
                    continue
                self._record(kill, samples, now)
            for report in reports:
                self._reported(report, samples, now)

    # finding kills ----------------------------------------------------------------

    def _counted(
        self, counts: dict[str, tuple[str, NodeOomCounts, float]], samples: dict[str, NodeSample]
    ) -> list[_Kill]:
        kills: list[_Kill] = []
        for node_id, (host, found, read_at) in sorted(counts.items()):
            for _ in range(self._ray.kills(node_id, found.ray_evictions)):
                kills.append(_Kill(node_id, host, Killer.RAY, read_at, sources=["ray_counter"]))
            added = self._kernel.kills(node_id, found.kernel_oom_kills)
            if added and found.kernel_oom_kills is not None:
                value = found.kernel_oom_kills
                # Nodes on one machine read one count: only what no node reported yet is new.
                done = self._host_kernel.get(host, value - added)
                fresh = max(0, min(added, int(value - done + 0.5)))
                self._host_kernel[host] = max(done, value)
                for _ in range(fresh):
                    kills.append(
                        _Kill(node_id, host, Killer.KERNEL, read_at, sources=["kernel_count"])
                    )
        live = set(samples) | set(counts)
        self._ray.keep_only(live)
        self._kernel.keep_only(live)
        hosts = {sample.host for sample in samples.values()} | {c[0] for c in counts.values()}
        self._host_kernel = {h: v for h, v in self._host_kernel.items() if h in hosts}
        return kills

    def _matched(self, kill: _Kill, reports: list[_Report]) -> bool:
        """Join a counted Ray kill to its report, or to a kill a report already recorded."""
        for index, report in enumerate(reports):
            if report.node_id == kill.node_id:
                del reports[index]
                kill.victim = report.victim
                kill.sources.append("out_of_memory_error")
                return False  # recorded now, with its victim
        for index, record in enumerate(self._awaiting_counter):
            if record.node_id == kill.node_id:
                del self._awaiting_counter[index]
                return True  # its post-mortem was written from the report
        return False

    def _reported(self, report: _Report, samples: dict[str, NodeSample], now: float) -> None:
        """A report no counted kill of this cycle took: a kill counted earlier, or a new one."""
        for index, record in enumerate(self._awaiting_victim):
            if report.node_id is not None and record.node_id == report.node_id:
                del self._awaiting_victim[index]
                self._name_victim(record, report.victim)
                return
        sample = samples.get(report.node_id or "")
        kill = _Kill(
            report.node_id or "unknown",
            sample.host if sample is not None else "unknown",
            Killer.RAY,
            _sample_time(sample),
            victim=report.victim,
            sources=["out_of_memory_error"],
        )
        record = self._record(kill, samples, now)
        if report.node_id is not None:
            self._awaiting_counter.append(record)

    def _expire(self, now: float) -> None:
        window = self.dedup_window_s
        self._awaiting_counter = [r for r in self._awaiting_counter if now - r.wall_time <= window]
        self._awaiting_victim = [r for r in self._awaiting_victim if now - r.wall_time <= window]

    # recording --------------------------------------------------------------------

    def _record(self, kill: _Kill, samples: dict[str, NodeSample], now: float) -> KillRecord:
        sample = samples.get(kill.node_id)
        document = self._document(kill, sample, now)
        path = self.writer.write(document) if self.writer is not None else None
        victim = kill.victim or Victim()
        record = KillRecord(
            kill.node_id,
            kill.host,
            kill.killer,
            now,
            victim,
            path,
            tuple(kill.sources),
            kill.monotonic_at,
            document,
        )
        self.ledger.count(kill.node_id, kill.killer)
        self.ledger.remember(record)
        if kill.killer is Killer.RAY and kill.victim is None:
            self._awaiting_victim.append(record)
        _LOGGER.warning(
            "raylens: a worker of %s was killed for memory on node %s (%s) by %s; post-mortem: %s",
            _group_words(victim),
            printable(kill.node_id[:64]),
            printable(kill.host[:64]),
            "Ray's memory monitor" if kill.killer is Killer.RAY else "the kernel's OOM killer",
            "not written" if path is None else printable(str(path)),
        )
        return record

    def _name_victim(self, record: KillRecord, victim: Victim) -> None:
        """A report named the victim of a kill already recorded: say so in its file."""
        document = dict(record.document)
        document["victim"] = {
            "group": None if victim.group is None else printable(victim.group[:200]),
            "worker_rank": victim.worker_rank,
            "pid": victim.pid,
        }
        document["seen_by"] = sorted({*document.get("seen_by", ()), "out_of_memory_error"})
        path = record.path
        if path is not None and self.writer is not None:
            path = self.writer.write(document, path)
        updated = replace(record, victim=victim, path=path, document=document)
        self.ledger.replace(record, updated)
        _LOGGER.info(
            "raylens: the worker killed for memory on node %s was of %s; post-mortem updated: %s",
            printable(record.node_id[:64]),
            _group_words(victim),
            "not written" if path is None else printable(str(path)),
        )

    def _document(self, kill: _Kill, sample: NodeSample | None, now: float) -> dict[str, Any]:
        growth = self.growth
        limit = None
        if growth is not None and sample is not None:
            limit = growth.kill_line.limit(sample.total)
        largest: Sequence[LargestProcess] = ()
        largest_at = None
        if self.largest_processes_of is not None and self._asks_left > 0:
            self._asks_left -= 1
            answer = self.largest_processes_of(kill.node_id)
            if answer is not None:
                largest, largest_at = answer
        try:
            phase = self.phase_of()
        except Exception:
            phase = None
        return build_postmortem(
            node_id=kill.node_id,
            host=kill.host,
            killer=kill.killer,
            wall_time=now,
            victim=kill.victim,
            phase=phase if isinstance(phase, str) else None,
            limit_bytes=limit,
            used_bytes=None if sample is None else sample.used,
            total_bytes=None if sample is None else sample.total,
            history=None
            if growth is None
            else growth.recent_history(kill.node_id, kill.monotonic_at),
            largest=largest,
            largest_sampled_at=largest_at,
            sources=kill.sources,
        )


def _sample_time(sample: NodeSample | None) -> float:
    if sample is None or sample.sampled_at is None:
        return 0.0
    return sample.sampled_at


def _group_words(victim: Victim) -> str:
    if victim.group is None:
        return "unknown group"
    words = f"worker group '{printable(victim.group[:80])}'"
    details = [
        f"rank {victim.worker_rank}" if victim.worker_rank is not None else "",
        f"pid {victim.pid}" if victim.pid is not None else "",
    ]
    joined = ", ".join(d for d in details if d)
    return f"{words} ({joined})" if joined else words
